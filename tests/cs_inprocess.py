"""Differential runs in one process: a model compiled by coordinator.compiler, trained on the
simulated CS system (wse_sim's CSSystem object, no gRPC, no subprocess) and by TensorFlow on
the CPU (tests/tf_reference.py) from the same initial weights and batches.

    result = compare(model_fn, input_fn, params, model_dir, steps=10)
    assert_same_training(result)        # losses and final weights (slots included) agree
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import CompileResult, compile_model
from cs_api import pb
from cs_api.tensors import assemble, from_tensor, tensor_chunks, to_tensor
from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph
from wafer.fabric import get_fabric
from wse_sim.cs_system import CSSystem

TOKEN = "in-process"


@dataclass(frozen=True)
class CSRun:
    losses: list[float]  # one per step
    state: dict[str, np.ndarray]  # weights, slots and scalars after the run (TF names)
    outputs: list[dict[str, np.ndarray]]  # per step: the program's streamed outputs


def _feed(system: CSSystem, data: Sequence[dict[str, np.ndarray]], first: int,
          errors: list[BaseException]) -> None:
    def requests():
        for index, batch in enumerate(data, start=first):
            yield pb.FeedRequest(token=TOKEN, worker_id=0, batch_index=index,
                                 tensors=[to_tensor(n, a) for n, a in batch.items()])
        yield pb.FeedRequest(token=TOKEN, worker_id=0, end=True)

    try:
        system.feed(requests())
    except BaseException as error:  # the run reports what it waited for
        errors.append(error)


def run_on_cs(program: pb.Program, weights: dict[str, np.ndarray],
              data: Sequence[tuple[np.ndarray, np.ndarray]], *, kind: str = "train",
              global_step: int = 0, first_batch: int = 0, with_outputs: bool = False) -> CSRun:
    """Run `len(data)` steps of `kind` on a fresh simulated CS system, one input stream."""
    system = CSSystem(get_fabric(program.fabric or "cs1"), idle_timeout=0, log=lambda line: None)
    header = pb.JobHeader(job_id="in-process", token=TOKEN, program=program, num_workers=1,
                          global_step=global_step, first_batch=first_batch)
    system.load(header, (chunk for name in sorted(weights)
                         for chunk in tensor_chunks(name, np.asarray(weights[name]))))
    errors: list[BaseException] = []
    feeder = threading.Thread(target=_feed, daemon=True, args=(
        system, [{"features": x, "labels": y} for x, y in data], first_batch, errors))
    feeder.start()
    try:
        steps = len(data)
        wanted = range(global_step + 1, global_step + steps + 1) if with_outputs else ()
        losses, outputs = [], []
        for result in system.run(kind, pb.RunRequest(token=TOKEN, steps=steps, output_steps=wanted),
                                 threading.Event()):
            if result.HasField("step"):
                losses.append(result.step.loss)
                outputs.append({t.name: from_tensor(t) for t in result.step.outputs})
        state = assemble(system.snapshot(TOKEN))
    finally:
        system.close()
        feeder.join(30)
    return CSRun(losses, state, outputs)


@dataclass(frozen=True)
class Comparison:
    compiled: CompileResult
    cs: CSRun
    reference: tf_reference.Reference


class CompileFailedAfterValidation(AssertionError):
    """--validate_only accepted the model, then --compile_only refused it."""


def compile_checked(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                    mode: str = "train") -> CompileResult:
    """Validate (CSRunError if refused), then compile: a model that validates must compile."""
    compile_model(model_fn, input_fn, params, model_dir, mode=mode, validate_only=True)
    try:
        return compile_model(model_fn, input_fn, params, model_dir, mode=mode)
    except CSRunError as error:
        raise CompileFailedAfterValidation(f"validated, then the compile failed: {error}") from None


def compare(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
            steps: int = 10) -> Comparison:
    """Validate and compile model_fn (CSRunError if refused), then train `steps` batches on
    the CS and on the CPU from the compiler's initial weights."""
    compiled = compile_checked(model_fn, input_fn, params, model_dir)
    data = tf_reference.batches(input_fn, params, steps)
    cs = run_on_cs(compiled.program, compiled.initial_weights, data)
    reference = tf_reference.run(model_fn, input_fn, params, compiled.initial_weights, data)
    return Comparison(compiled, cs, reference)


def evaluation_mismatch(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                        weights: dict[str, np.ndarray], steps: int = 2, rtol: float = 1e-4) -> str:
    """"" if the CS's evaluation (a program compiled for eval, loaded with `weights`) gives
    TensorFlow's loss on `steps` batches; else what differs."""
    compiled = compile_checked(model_fn, input_fn, params, model_dir, mode="eval")
    data = tf_reference.batches(input_fn, params, steps)
    loaded = {n: weights[n] for n in compiled.initial_weights}
    cs = run_on_cs(compiled.program, loaded, data, kind="evaluate")
    reference = tf_reference.run(model_fn, input_fn, params, loaded, data, mode="eval")
    if not np.allclose(cs.losses, reference.losses, rtol=rtol):
        return f"evaluation losses: CS {cs.losses} vs TF {reference.losses}"
    return ""


def mismatches(result: Comparison, rtol: float = 1e-4) -> list[str]:
    """Where the CS's training differs from TensorFlow's, one line each (empty: the same).

    Losses agree to `rtol`; every variable the CS holds agrees elementwise to `rtol` of its
    value plus `rtol` of the largest magnitude among its kind (all weights, or all slots of
    one name: near-zero entries such as an attention key bias, whose true gradient is 0,
    are rounding noise at that scale), and its change over the run to 1% of TF's largest
    change (a frozen weight that moved, an unclipped gradient). TF's optimizer slots of the
    CS's variables must be in the CS's state."""
    problems = []
    cs, ref, initial = result.cs, result.reference, result.compiled.initial_weights
    losses, ref_losses = np.asarray(cs.losses, np.float64), np.asarray(ref.losses, np.float64)
    if losses.shape != ref_losses.shape or not np.allclose(
            losses, ref_losses, rtol=rtol, atol=rtol * 1e-2 * np.abs(ref_losses).max(initial=0)):
        problems.append(f"losses: CS {losses.tolist()} vs TF {ref_losses.tolist()}")
    missing = sorted(set(initial) - set(cs.state))
    if missing:
        problems.append(f"the CS state lacks {missing}")
    def kind(name: str) -> str:
        owner = next((v for v in initial if name.startswith(v + "/")), None)
        return "weights" if name in initial else name[len(owner) + 1:] if owner else name

    kind_scale: dict[str, float] = {}
    for name, value in ref.state.items():
        kind_scale[kind(name)] = max(kind_scale.get(kind(name), 0.0),
                                     float(np.abs(np.asarray(value, np.float64)).max(initial=0.0)))
    for name, value in sorted(cs.state.items()):
        if name not in ref.state:
            problems.append(f"{name}: not a variable of the TF graph")
            continue
        want = np.asarray(ref.state[name], np.float64)
        got = np.asarray(value, np.float64)
        if got.shape != want.shape:
            problems.append(f"{name}: shape {got.shape} vs TF {want.shape}")
            continue
        floor = rtol * kind_scale[kind(name)]
        err = np.abs(got - want)
        bad = err > rtol * np.abs(want) + floor
        if name in initial:
            start = np.asarray(initial[name], np.float64)
            moved = np.abs(want - start).max(initial=0.0)
            bad |= np.abs((got - start) - (want - start)) > 1e-2 * moved + floor
        if bad.any():
            worst = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
            problems.append(f"{name}: {int(bad.sum())} of {bad.size} elements differ, worst at "
                            f"{worst}: CS {got[worst]:.8g} vs TF {want[worst]:.8g}"
                            + (f" (start {np.asarray(initial[name])[worst]:.8g})"
                               if name in initial else ""))
    slots = [n for n in ref.state if any(n.startswith(v + "/") for v in initial)
             and n not in cs.state]
    if slots:
        problems.append(f"TF's optimizer state {sorted(slots)} is not in the CS's state")
    return problems


def assert_same_training(result: Comparison, rtol: float = 1e-4) -> None:
    problems = mismatches(result, rtol)
    assert not problems, "the CS trained differently from TensorFlow:\n  " + "\n  ".join(problems)


def model_op_words(model_fn: Callable, input_fn: Callable, params: dict) -> set[str]:
    """What a refusal may name of model_fn's training graph: its op types (MatMul), its
    scoped op and variable names (dense/bias) and its inputs (features, labels)."""
    signature = batch_signature(make_dataset(input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        call_model_fn(model_fn, features, labels, "train", params)
        ops = graph.get_operations()
        return ({op.type for op in ops} | {op.name for op in ops if "/" in op.name}
                | {op.name for op in ops if op.type == "Placeholder"})


def refusal_problem(error: CSRunError, source_file: str, op_words: set[str]) -> str:
    """"" if the refusal's one line names an op of the model (`model_op_words`) and a line
    of `source_file` (its base name); else why not."""
    text = str(error)
    if "\n" in text:
        return f"the refusal is not one line: {text!r}"
    name = re.escape(source_file.rsplit("/", 1)[-1])
    if not re.search(rf"(?:^|[\s/(']){name}:\d+", text):
        return f"the refusal names no line of {source_file}: {text!r}"
    if not any(re.search(rf"(?<![\w/]){re.escape(t)}(?![\w/])", text) for t in op_words):
        return f"the refusal names none of the model's ops: {text!r}"
    return ""
