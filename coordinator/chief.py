"""The chief of a CS job: compile (or reuse), Load into the CS, drive the run, write what
the CPU path writes (log lines, events, checkpoints with the TF graph's variable names).

- train: the program is loaded with the compile's initial weights, or with the newest
  checkpoint's weights and optimizer slots, and trained in segments of
  `save_checkpoints_steps`; after each segment the CS is snapshotted into a checkpoint. A
  NaN loss stops the run naming the step; the newest checkpoint stays the last good one.
  A stop signal (`coordinator.stop_request`) ends the run with a checkpoint at the step
  the CS reached, for an exact resume (Slurm's requeue, a rerun).
- evaluate: a checkpoint's weights run the EVAL program; the host_call metrics are computed
  here from the outputs the CS streams back (`tf_model.metrics.EvalMetrics`).
- predict: a checkpoint's weights run the PREDICT program; predictions are computed here
  from the streamed outputs (`tf_model.predictions`) and written to `model_dir/predict/`.

For every phase the chief publishes the rendezvous its input workers wait for; a job of
one task runs one worker thread inside the chief (`CSJob`).
"""
from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from common.errors import CSRunError, Stopped
from common.run_kinds import RunKind
from common.run_settings import RunSettings, end_step
from coordinator.compiler import compile_model
from coordinator.roles import TaskRole
from coordinator.starvation import StarvationWatch
from coordinator.stop_request import StopRequest, next_piece
from cs_api import pb
from cs_api.client import CSClient
from cs_api.input_spec import program_inputs
from cs_api.tensors import from_tensor
from slurm.jobs import ProgressFile
from tf_model import checkpoints, progress
from tf_model.checkpoints import is_optimizer_scalar, is_optimizer_state, optimizer_changed, optimizer_of
from tf_model.estimator_spec import ModeKeys
from tf_model.events import EventWriter, eval_dir
from tf_model.metrics import EvalMetrics, MetricValue
from tf_model.model_dir_lock import model_dir_locked
from tf_model.model_fn import batch_signature, make_dataset, run_batches
from tf_model.predictions import PredictionGraph, Predictions, write_predictions
from wafer import loss_scaling
from wafer.optimizers import OPTIMIZERS, OptimizerConfig, slot_name
from workers.feed import run_worker
from workers.rendezvous import Rendezvous, publish


def weight_params(program: pb.Program) -> list[pb.Param]:
    """The Params naming the variables the CS holds as weights: the kernels' (but derived
    weights, which the weight program computes) and the weight program's sources."""
    derived = {k.name for k in program.weight_program.kernels}
    return [p for k in program.kernels for p in k.params if p.variable not in derived] + \
        list(program.weight_program.sources)


def program_variables(program: pb.Program) -> list[str]:
    """The variables the CS holds: the kernels' weights, their moving averages, what the
    schedules read, a dynamic loss scale's variables, the accumulators of an update cond
    and carried states (a ring pointer)."""
    schedules = [*program.schedules, *(m.factor for m in program.moving_averages)]
    dynamic = loss_scaling.of_program(program)
    return [p.variable for p in weight_params(program)] + list(dict.fromkeys(
        [*(m.shadow for m in program.moving_averages),
         *(o.name for s in schedules for o in s.ops if o.op == "variable"),
         *(dynamic.state if dynamic else ()),
         *program.conditional_update.accumulators,
         *(w.variable for w in program.weight_writes if w.carried_dtype)]))


def tf_optimizer(*optimizers: pb.Optimizer) -> str:
    """The TF optimizers whose state the CS optimizers keep, as `optimizer_of` names them
    from the slot and scalar names `wafer.optimizers` gives ("" for plain SGD)."""
    names = []
    for optimizer in optimizers:
        rule = OPTIMIZERS.get(optimizer.type)
        if rule is None:  # the CS refuses the program, naming the optimizer
            return optimizer.type
        kept = rule(OptimizerConfig.from_message(optimizer))
        names += [*(slot_name("w", s) for s in kept.slot_suffixes), *kept.scalar_names]
    return optimizer_of(names)


def cs_state(program: pb.Program, tensors: dict[str, np.ndarray],
             path: str = "the checkpoint") -> dict[str, np.ndarray]:
    """The program's weights and, when it trains with the optimizer whose state the
    checkpoint holds, that state (another optimizer starts fresh, as on the CPU path)."""
    variables = set(program_variables(program))
    missing = sorted(variables - set(tensors))
    if missing:
        raise CSRunError(f"{path} has no {', '.join(missing[:3])}: it was written by "
                         "another model", "use a new model_dir for a changed model")
    checkpoints.check_shapes(path, {p.variable: tuple(p.variable_shape or p.shape)
                                    for p in weight_params(program)},
                             {n: np.shape(a) for n, a in tensors.items()})
    keep = set(variables)
    if program.HasField("optimizer") and program.optimizer.type and not optimizer_changed(
            path, tensors, tf_optimizer(program.optimizer,
                                        *(g.optimizer for g in program.optimizer_groups))):
        keep |= {n for n in tensors if is_optimizer_state(n)
                 and (is_optimizer_scalar(n) or n.rsplit("/", 1)[0] in variables)}
    return {n: np.asarray(a) for n, a in tensors.items() if n in keep}


def resumed_step(path: str, stored: dict[str, np.ndarray]) -> int:
    """The step a training run resumes from, as the CPU path's: the checkpoint's global_step
    variable (below the N of model.ckpt-N after steps dynamic loss scaling skipped)."""
    value = stored.get("global_step")
    return int(value) if value is not None else checkpoints.checkpoint_step(path)


def host_state(initial: dict[str, np.ndarray],
               checkpoint: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Variables of the user's graph the CS does not hold (e.g. Keras' dropout seed state):
    written into every checkpoint so that the CPU path restores it, with the values of the
    checkpoint the run resumed from where it has them."""
    return {n: (checkpoint or {}).get(n, value) for n, value in initial.items()}


def output_tensor_names(program: pb.Program) -> dict[str, str]:
    """CS output name (a kernel or a program input) → the TF tensor it stands for."""
    names = {s.name: f"{s.name}:0" for s in program.inputs}
    names.update({k.name: k.tf_tensor for k in program.kernels})
    return names


def streamed_names(program: pb.Program) -> list[str]:
    """The TF tensors the program's streamed outputs stand for."""
    names = output_tensor_names(program)
    return [names[name] for name in program.outputs]


def combined(total: pb.JobSummary | None, run: pb.JobSummary) -> pb.JobSummary:
    """The summary of the runs so far and `run` (utilization weighted by simulated time)."""
    if total is None:
        return run
    samples, sim, wall = total.samples + run.samples, total.sim_seconds + run.sim_seconds, \
        total.wall_seconds + run.wall_seconds
    used = total.utilization * total.sim_seconds + run.utilization * run.sim_seconds
    return pb.JobSummary(steps=total.steps + run.steps, samples=samples, sim_seconds=sim, wall_seconds=wall,
                         sim_samples_per_sec=samples / sim if sim > 0 else 0.0,
                         wall_samples_per_sec=samples / wall if wall > 0 else 0.0,
                         utilization=used / sim if sim > 0 else 0.0,
                         input_wait_seconds=total.input_wait_seconds + run.input_wait_seconds)


def host_values(program: pb.Program, result: pb.StepResult) -> dict[str, np.ndarray]:
    """A step's streamed outputs by the TF tensor names the host-side graphs feed."""
    names = output_tensor_names(program)
    return {names[t.name]: from_tensor(t) for t in result.outputs}


class CSJob:
    """One phase on the CS: the program loaded, the rendezvous published, and (for a job of
    one task) the input worker running in a thread. Use as a context manager."""
    def __init__(self, chief: "Chief", program: pb.Program, state: dict[str, np.ndarray],
                 global_step: int, first_batch: int, num_batches: int, input_fn: Callable,
                 kind: RunKind = RunKind.TRAIN):
        self.program = program
        assert chief.config.cs_ip is not None, "the estimator dispatches to the chief with a CS only"
        self.client = CSClient(chief.config.cs_ip, chief.config.cs_tls_ca)
        self.client.status()  # an unreachable CS: one clear line before any work
        role = chief.role
        reply = self.client.load(role.job_id, program, state, role.num_workers, global_step,
                                 first_batch, wait_s=role.cs_wait_s)
        rendezvous = Rendezvous(self.client.cs_ip, reply.job_id or role.job_id, self.client.token,
                                role.num_workers, first_batch, num_batches, program_inputs(program),
                                program.batch_size, cs_tls_ca=self.client.tls_ca or "", kind=str(kind))
        publish(chief.rendezvous_path, rendezvous)
        self._errors: list[BaseException] = []
        self._thread = None
        if role.num_tasks == 1:  # a job of one task runs one worker inside the chief
            self._thread = threading.Thread(target=self._work, args=(input_fn, chief.params, rendezvous),
                                            name="input-worker-0", daemon=True)
            self._thread.start()

    def _work(self, input_fn: Callable, params: dict, rendezvous: Rendezvous) -> None:
        try:
            run_worker(input_fn, params, rendezvous, 0)
        except BaseException as error:  # reported by the chief's loop
            self._errors.append(error)
            self.client.close()  # ends the chief's run stream, which waits for batches

    def run(self, kind: RunKind, steps: int, output_steps: tuple[int, ...] = ()) -> Iterator[pb.RunResult]:
        """The CS's per-step results; a failure of the in-chief worker is the error raised."""
        try:
            yield from self.client.run(kind, steps, output_steps)
        except CSRunError:
            if self._errors:
                raise self._errors[0] from None
            raise
        if self._errors:
            raise self._errors[0]

    def snapshot(self) -> dict[str, np.ndarray]:
        """The CS's state; a failure of the in-chief worker (which closed the client) is the error raised."""
        try:
            return self.client.snapshot()
        except CSRunError:
            if self._errors:
                raise self._errors[0] from None
            raise

    def __enter__(self) -> "CSJob":
        return self

    def __exit__(self, *exc) -> None:
        self.client.unload()
        self.client.close()
        if self._thread is not None:
            self._thread.join(timeout=30)


class Chief:
    def __init__(self, model_fn: Callable, config: RunSettings, role: TaskRole, rendezvous_path: Path):
        self.model_fn = model_fn
        self.config = config
        self.role = role
        self.rendezvous_path = rendezvous_path
        self.params = config.params
        self.model_dir = config.model_dir

    def run(self, kind: RunKind, input_fn: Callable, **kwargs: Any) -> Any:
        """Run the phase; if it ends without publishing its rendezvous (nothing to do, or an
        error first), publish an ended one so that the input workers stop at once."""
        try:
            phases: dict[RunKind, Callable[..., Any]] = {
                RunKind.TRAIN: self.train, RunKind.EVALUATE: self.evaluate, RunKind.PREDICT: self.predict}
            result = phases[kind](input_fn, **kwargs)
        except BaseException as error:
            self._end_phase(f"the chief stopped: {error}" if str(error) else "the chief stopped")
            raise
        self._end_phase("the chief had nothing to do (max_steps already reached)")
        return result

    def _end_phase(self, why: str) -> None:
        if not self.rendezvous_path.exists():
            publish(self.rendezvous_path, Rendezvous.nothing(self.role.num_workers, why))

    def _compile(self, input_fn: Callable, mode: str) -> Any:
        result = compile_model(self.model_fn, input_fn, self.params, self.config.compile_dir,
                               mode=mode)
        if result.note:
            print(result.note, flush=True)
        return result

    def train(self, input_fn: Callable, steps: int | None = None,
              max_steps: int | None = None) -> None:

        with model_dir_locked(self.model_dir):
            self._train(input_fn, steps, max_steps)

    def _train(self, input_fn: Callable, steps: int | None, max_steps: int | None) -> None:
        program = (compiled := self._compile(input_fn, ModeKeys.TRAIN)).program
        latest = checkpoints.latest_checkpoint(self.model_dir, set_aside=True)
        if latest is not None:
            progress.restoring(latest)
            stored = checkpoints.read_checkpoint(latest)
            step = resumed_step(latest, stored)
            state = cs_state(program, stored, latest)
            host = host_state(compiled.host_variables, stored)
        else:
            step = 0
            state = dict(compiled.initial_weights)
            host = host_state(compiled.host_variables)
        end = end_step(step, steps, max_steps)
        if end <= step:
            progress.skipping(step)
            return
        config = self.config
        log = progress.TrainingProgress(step, program.batch_size, config.log_step_count_steps)
        rate = progress.StepRate(step)
        every = config.save_checkpoints_steps or (end - step)
        loss, summary = math.nan, None
        variable_step = step  # TF's global_step (dynamic loss scaling's skipped steps leave it)
        status = ProgressFile(self.role.job_dir, step, end, program.batch_size) if self.role.job_dir else None
        starvation = StarvationWatch(self.role.num_workers, program.batch_size)
        with CSJob(self, program, state, step, step, end - step, input_fn) as job, \
                EventWriter(self.model_dir) as events, StopRequest() as stop:
            piece = 1
            while step < end:
                segment_end = min(step + every - step % every, end)
                while step < segment_end and stop.signum is None:
                    started, first = time.monotonic(), step
                    for result in job.run(RunKind.TRAIN, min(piece, segment_end - step)):
                        if result.HasField("summary"):
                            summary = combined(summary, result.summary)
                            continue
                        step, loss = result.step.step, result.step.loss
                        variable_step = result.step.global_step_variable
                        if not math.isfinite(loss):
                            raise checkpoints.non_finite_loss(loss, step, self.model_dir)
                        log.step(step, loss)
                        if starved := starvation.step(step, result.step.timing):
                            print(starved, flush=True)
                        if status is not None:
                            status.step(step, loss, result.step.timing.sim_samples_per_sec)
                        if config.save_summary_steps and step % config.save_summary_steps == 0:
                            events.scalars(step, {"loss": loss, "global_step/sec": rate(step),
                                                  "cs/samples_per_sec": result.step.timing.sim_samples_per_sec})
                    piece = next_piece(step - first, time.monotonic() - started, end - step)
                events.flush()
                snapshot = {**host, **job.snapshot()}
                snapshot["global_step"] = np.asarray(variable_step, np.int64)
                saved = checkpoints.write_checkpoint(self.model_dir, step, snapshot, config.keep_checkpoint_max)
                log.saved(step, self.model_dir)
                if status is not None:
                    status.saved(saved)
                if stop.signum is not None:
                    stopped = Stopped(stop.signum)
                    stopped.done = f"checkpoint at step {step} written ({saved})"
                    raise stopped
        if starved := starvation.flush():
            print(starved, flush=True)
        log.finished(step, loss)
        if status is not None:
            status.finished(starvation.summary())
        if summary is not None:
            print(f"Simulated CS system: {summary.sim_samples_per_sec:,.0f} samples/second "
                  f"(utilization {summary.utilization:.1%}); wall clock here: "
                  f"{summary.wall_samples_per_sec:,.0f} samples/second", flush=True)
        if starvation.summary():
            print(f"Input starvation over the run: {starvation.summary()}", flush=True)

    def _checkpoint_state(self, program: pb.Program, checkpoint_path: str | None,
                          ) -> tuple[str, int, int, dict]:
        """The checkpoint's path, its N (model.ckpt-N), its global_step variable (what TF's
        graph reads: the step the CS computes values of the step at) and the CS's state."""
        path = checkpoints.chosen_checkpoint(self.model_dir, checkpoint_path)
        stored = checkpoints.read_checkpoint(path)
        return path, checkpoints.checkpoint_step(path), resumed_step(path, stored), \
            cs_state(program, stored, path)

    def evaluate(self, input_fn: Callable, steps: int | None = None,
                 checkpoint_path: str | None = None) -> dict[str, MetricValue]:
        """The metrics of `steps` batches (the whole input when None) on the CS."""
        steps = run_batches(make_dataset(input_fn, self.params), RunKind.EVALUATE, steps, "--eval_steps")
        program = self._compile(input_fn, ModeKeys.EVAL).program
        path, step, variable_step, state = self._checkpoint_state(program, checkpoint_path)
        streamed = streamed_names(program)
        with EvalMetrics(self.model_fn, input_fn, self.params, path, streamed) as metrics, \
                CSJob(self, program, state, variable_step, 0, steps, input_fn,
                      RunKind.EVALUATE) as job:
            for result in job.run(RunKind.EVALUATE, steps):
                if result.HasField("step"):
                    metrics.update({**host_values(program, result.step),
                                    metrics.loss_name: np.asarray(result.step.loss, np.float32)})
            results = metrics.results()
        progress.eval_results(step, results)
        with EventWriter(eval_dir(self.model_dir)) as events:
            events.scalars(step, results)
        return {**results, "global_step": step}

    def predict(self, input_fn: Callable, checkpoint_path: str | None = None,
                num_samples: int | None = None) -> Predictions:

        dataset = make_dataset(input_fn, self.params)
        program = self._compile(input_fn, ModeKeys.PREDICT).program
        batch = program.batch_size
        if num_samples is None:
            steps = run_batches(dataset, RunKind.PREDICT, None, "num_samples")
        else:  # as on the CPU path, a shorter input gives fewer predictions
            steps = -(-num_samples // batch)
            known = int(dataset.cardinality())
            steps = min(steps, known) if known >= 0 else steps
        path, step, variable_step, state = self._checkpoint_state(program, checkpoint_path)
        collected: dict[str, list[np.ndarray]] = {}
        with PredictionGraph(self.model_fn, batch_signature(dataset), self.params, path,
                             streamed_names(program)) as graph, \
                CSJob(self, program, state, variable_step, 0, steps, input_fn,
                      RunKind.PREDICT) as job:
            for result in job.run(RunKind.PREDICT, steps):
                if result.HasField("step"):
                    for key, value in graph.run(host_values(program, result.step)).items():
                        collected.setdefault(key, []).append(value)
        return write_predictions(self.model_dir, step, collected, num_samples, graph.keyed, batch)
