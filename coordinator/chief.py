"""The chief of a CS job: compile (or reuse), Load into the CS, drive the run, write what
the CPU path writes (log lines, checkpoints with the TF graph's variable names).

Training: the program is loaded with the compile's initial weights, or with the newest
checkpoint's weights and optimizer slots; the chief publishes the rendezvous for its
workers (a lone chief starts one worker thread itself), then runs Train in segments of
`save_checkpoints_steps`, snapshotting the CS into a checkpoint after each segment. A NaN
loss stops the run naming the step; the newest checkpoint stays the last good one.
"""
from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from coordinator.cs_client import CSClient
from coordinator.roles import TaskRole
from launcher.errors import CSRunError
from wse_sim.api import pb
from workers.feed import run_worker
from workers.rendezvous import InputSpec, Rendezvous, publish

_SLOT_SUFFIXES = ("/Adam", "/Adam_1", "/Momentum")
_OPTIMIZER_SCALARS = ("beta1_power", "beta2_power")


def program_inputs(program: pb.Program) -> tuple[InputSpec, ...]:
    """The batch shapes and dtypes every streamed batch must have."""
    return tuple(InputSpec(s.name, pb.DType.Name(s.dtype).lower(), (program.batch_size, *s.shape))
                 for s in program.inputs)


def cs_state(program: pb.Program, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program's weights and their optimizer slots from a checkpoint's tensors."""
    variables = {p.variable for k in program.kernels for p in k.params}
    slots = {v + s for v in variables for s in _SLOT_SUFFIXES}
    return {n: np.asarray(a) for n, a in tensors.items()
            if n in variables or n in slots or n in _OPTIMIZER_SCALARS}


class Chief:
    def __init__(self, estimator: Any, role: TaskRole, rendezvous_path: Path):
        self.estimator = estimator
        self.role = role
        self.rendezvous_path = rendezvous_path
        self.params = estimator.params
        self.model_dir = str(estimator.model_dir)
        self.config = estimator.config

    def run(self, action: str, input_fn: Callable, **kwargs: Any) -> Any:
        if action != "train":
            raise CSRunError(f"{action} on the CS system is not available in this build",
                             "run it on the CPU path (without --cs_ip)")
        return self.train(input_fn, steps=kwargs.get("steps"), max_steps=kwargs.get("max_steps"))

    def _start(self, program: pb.Program, state: dict[str, np.ndarray], step: int, steps: int,
               input_fn: Callable) -> tuple[CSClient, threading.Thread | None, list]:
        client = CSClient(self.config.cs_ip)
        client.status()  # unreachable CS: one clear line before any work
        reply = client.load(self.role.job_id, program, state, self.role.num_workers, step)
        rendezvous = Rendezvous(client.cs_ip, reply.job_id or self.role.job_id, client.token,
                                self.role.num_workers, step, steps, program_inputs(program))
        publish(self.rendezvous_path, rendezvous)
        errors: list = []
        thread = None
        if self.role.num_tasks == 1:  # a job of one task runs one worker inside the chief
            def work():
                try:
                    run_worker(input_fn, self.params, rendezvous, 0)
                except BaseException as error:  # reported by the chief's loop
                    errors.append(error)
                    client.close()  # ends the chief's Train stream, which waits for batches
            thread = threading.Thread(target=work, name="input-worker-0", daemon=True)
            thread.start()
        return client, thread, errors

    def train(self, input_fn: Callable, steps: int | None, max_steps: int | None) -> None:
        from launcher.checkpoints import latest_checkpoint, read_checkpoint, write_checkpoint
        from launcher.compiler import compile_model
        from launcher.estimator_spec import ModeKeys

        compiled = compile_model(self.estimator.model_fn, input_fn, self.params, self.model_dir,
                                 mode=ModeKeys.TRAIN)
        program = compiled.program
        latest = latest_checkpoint(self.model_dir)
        if latest is not None:
            tensors = read_checkpoint(latest)
            step = int(tensors.get("global_step", 0))
            state = cs_state(program, tensors)
            print(f"Restoring parameters from {latest}", flush=True)
        else:
            step, state = 0, dict(compiled.initial_weights)
        end = max_steps if max_steps is not None else step + (steps or 0)
        if end <= step:
            print(f"Skipping training since max_steps has already saved: {step}", flush=True)
            return
        client, thread, worker_errors = self._start(program, state, step, end - step, input_fn)
        every = int(self.config.save_checkpoints_steps or (end - step))
        log_every = int(self.config.log_step_count_steps or 100)
        batch = program.batch_size
        start_step, t0, last_log, t_log = step, time.perf_counter(), step, time.perf_counter()
        loss = math.nan
        summary = None
        try:
            while step < end:
                segment = min(every - step % every, end - step)
                for result in client.run("train", segment):
                    if result.HasField("summary"):
                        summary = result.summary
                        continue
                    step, loss = result.step.step, result.step.loss
                    if not math.isfinite(loss):
                        raise CSRunError(f"the loss became {loss} at step {step}",
                                         "lower the learning rate; the newest checkpoint is the last good one")
                    if step % log_every == 0:
                        now = time.perf_counter()
                        print(f"global step {step}: loss = {loss:.6g} "
                              f"({(step - last_log) / (now - t_log):.4g} steps/sec)", flush=True)
                        last_log, t_log = step, now
                if worker_errors:
                    raise worker_errors[0]
                snapshot = client.snapshot()
                snapshot["global_step"] = np.asarray(step, np.int64)
                path = write_checkpoint(self.model_dir, step, snapshot, self.config.keep_checkpoint_max)
                print(f"Saving checkpoints for {step} into {path}.", flush=True)
        except CSRunError:
            if worker_errors:  # the stream ended because the in-chief worker failed
                raise worker_errors[0] from None
            raise
        finally:
            client.unload()
            client.close()
        seconds = time.perf_counter() - t0
        samples = (step - start_step) * batch
        print(f"Training finished with {samples} samples in {seconds:.3f} seconds, "
              f"{samples / seconds:.2f} samples/second.", flush=True)
        if summary is not None:
            print(f"Simulated CS system: {summary.sim_samples_per_sec:,.0f} samples/second "
                  f"(wall clock here: {samples / seconds:,.0f} samples/second)", flush=True)
        print(f"Loss for final step: {loss}.", flush=True)
        if thread is not None:
            thread.join(timeout=30)
