"""Differential runs in one process: a model compiled by coordinator.compiler, trained on the
simulated CS system (wse_sim's CSSystem object, no gRPC, no subprocess) and by TensorFlow on
the CPU (tests/tf_reference.py) from the same initial weights and batches.

    result = compare(model_fn, input_fn, params, model_dir, steps=10)
    assert_same_training(result)        # losses and final weights (slots included) agree
"""
from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import tf_reference

from common.errors import CSRunError
from common.run_settings import RunSettings
from coordinator.chief import cs_state, output_tensor_names, resumed_step, streamed_names
from coordinator.compiler import CompileResult, compile_model
from coordinator.compiler.artifacts import WEIGHTS
from cs_api import pb
from cs_api.attrs import from_attr
from cs_api.input_spec import as_streamed, program_inputs
from cs_api.tensors import assemble, from_tensor, tensor_chunks, to_tensor
from tf_model import checkpoints, cpu_session
from tf_model.metrics import EvalMetrics
from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph, named_inputs, numpy_batches
from tf_model.predictions import PredictionGraph
from wafer import timing
from wafer.fabric import get_fabric
from wafer.kernels.candidate_sampling import Classes
from wafer.kernels.draw_replay import DRAWING, replayed_draws
from workers.feed import input_dataset
from wse_sim.cs_system import CSSystem
from wse_sim.program import check_program

TOKEN = "in-process"
STEPS_WRITTEN = 10  # the global step of the checkpoints trained_checkpoint writes


@dataclass(frozen=True)
class CSRun:
    losses: list[float]  # one per step
    state: dict[str, np.ndarray]  # weights, slots and scalars after the run (TF names)
    outputs: list[dict[str, np.ndarray]]  # per step: the program's streamed outputs
    global_steps: list[int]  # per step: TF's global step variable after it (what the chief saves)


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
              data: Sequence[tuple[Any, Any]], *, kind: str = "train",
              global_step: int = 0, first_batch: int = 0, with_outputs: bool = False) -> CSRun:
    """Run `len(data)` steps of `kind` on a fresh simulated CS system, one input stream."""
    system = CSSystem(get_fabric(program.fabric or "cs1"), idle_timeout=0, log=lambda line: None)
    header = pb.JobHeader(job_id="in-process", token=TOKEN, program=program, num_workers=1,
                          global_step=global_step, first_batch=first_batch)
    system.load(header, (chunk for name in sorted(weights)
                         for chunk in tensor_chunks(name, np.asarray(weights[name]))))
    errors: list[BaseException] = []
    feeder = threading.Thread(target=_feed, daemon=True, args=(
        system, [as_streamed(named_inputs(x, y), program_inputs(program)) for x, y in data], first_batch,
        errors))
    feeder.start()
    try:
        steps = len(data)
        wanted = range(global_step + 1, global_step + steps + 1) if with_outputs else ()
        losses, outputs, global_steps = [], [], []
        for result in system.run(kind, pb.RunRequest(token=TOKEN, steps=steps, output_steps=wanted),
                                 threading.Event()):
            if result.HasField("step"):
                losses.append(result.step.loss)
                global_steps.append(result.step.global_step_variable)
                outputs.append({t.name: from_tensor(t) for t in result.step.outputs})
        state = assemble(system.snapshot(TOKEN))
    finally:
        system.close()
        feeder.join(30)
    return CSRun(losses, state, outputs, global_steps)


def at_micro_batch(program: pb.Program, micro: int) -> pb.Program:
    """A copy of `program` that streams micro-batches of `micro` samples."""
    copy = pb.Program()
    copy.CopyFrom(program)
    copy.micro_batch_size = micro
    return copy


@dataclass(frozen=True)
class Comparison:
    compiled: CompileResult
    cs: CSRun
    reference: tf_reference.Reference


class CompileFailedAfterValidation(AssertionError):
    """--validate_only accepted the model, then --compile_only refused it."""


def compile_checked(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                    mode: str = "train") -> CompileResult:
    """Compile, or the validation's refusal (CSRunError): a model that validates must compile.

    The compile runs every step of the validation (compile_model: extract, match, check,
    build the kernels) before it places and emits, so a compiled model has validated; only
    a refused one is validated too (about half a compile's time saved per compiled model)."""
    try:
        return compile_model(model_fn, input_fn, params, model_dir, mode=mode)
    except CSRunError as error:
        compile_model(model_fn, input_fn, params, model_dir, mode=mode, validate_only=True)
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


def weight_program_timing(program: pb.Program) -> tuple[Any, list[Any], Any]:
    """(the timing model's training step, the weight program's checked steps, the fabric)
    of a compiled program that has a weight program."""
    checked = check_program(program)
    assert checked.weight_program is not None
    steps = list(checked.weight_program.steps)
    fabric = get_fabric(program.fabric)
    return (timing.program_timing(program, checked.kernels, fabric, training=True,
                                  weight_kernels=[s.kernel for s in steps]), steps, fabric)


def kernel_types(program: pb.Program) -> set[str]:
    """The types of the program's kernels, its weight program's included."""
    return {k.type for k in program.kernels} | {k.type for k in program.weight_program.kernels}


def weight_draws(program: pb.Program) -> list[str]:
    """The weight program's drawing kernels: numbers drawn once a step for the whole batch."""
    return [k.name for k in program.weight_program.kernels if k.type == "random"]


def drawing_kernels(program: pb.Program, masks: Mapping[str, str] = {}) -> dict[str, str]:
    """The program's kernels drawing numbers of their own (its weight program's too) -> the
    TF tensor each computes (a sampled_logits kernel: its sampler's sampled ids, the kernel
    named for the sampler op; a dropout kernel: the uniform numbers of its mask, `masks`'
    (tf_reference.mask_uniforms), one not given drawing its own)."""
    kernels = [*program.kernels, *program.weight_program.kernels]
    return {k.name: f"{k.name}:0" if k.type == "sampled_logits" else masks.get(k.name, k.tf_tensor)
            for k in kernels if k.type in DRAWING and (k.type != "dropout" or k.name in masks)}


def drawn_tensors(program: pb.Program, masks: Mapping[str, str] = {}) -> list[str]:
    """What TF's run fetches for tfs_draws: the drawing kernels' tensors, and each candidate
    sampler's expected counts of its sampled ids (which tell its number of tries)."""
    counts = [f"{k.name}:2" for k in program.kernels if k.type == "sampled_logits"]
    return sorted({*drawing_kernels(program, masks).values(), *counts})


def dropout_masks(model_fn: Callable, input_fn: Callable, params: dict,
                  program: pb.Program) -> dict[str, str]:
    """The program's dropout kernels -> the TF tensors of their masks' uniform numbers."""
    selects = {k.name: (k.tf_tensor, tuple(k.output_shape)) for k in program.kernels
               if k.type == "dropout"}
    return tf_reference.mask_uniforms(model_fn, input_fn, params, selects) if selects else {}


def assert_evaluation_draws_every_batch(model_fn: Callable, input_fn: Callable, params: dict,
                                        model_dir: str, checkpoint: str) -> pb.Program:
    """A model drawing in its EVAL graph, evaluated on the CS from `checkpoint` over three
    batches: handed TF's draws, the losses are TF's batch by batch (1e-5); with its own, one
    batch evaluated twice gives two losses, and a second run the same two. Returns the
    eval program."""
    program = compile_checked(model_fn, input_fn, params, model_dir, mode="eval").program
    assert program is not None and drawing_kernels(program)
    stored = checkpoints.read_checkpoint(checkpoint)
    state, step = cs_state(program, stored, checkpoint), resumed_step(checkpoint, stored)
    data = first_batches(input_fn, params, 3)
    # TF at the checkpoint's step too (a loss reading a schedule); strict=False: an eval
    # graph that reads no global step has none
    reference = tf_reference.run(model_fn, input_fn, params, {**state, "global_step": np.int64(step)},
                                 data, mode="eval", fetch=drawn_tensors(program), strict=False)
    with tfs_draws(program, reference.fetched):
        replayed = run_on_cs(program, state, data, kind="evaluate", global_step=step)
    np.testing.assert_allclose(replayed.losses, reference.losses, rtol=1e-5)
    own = [run_on_cs(program, state, [data[0]] * 2, kind="evaluate", global_step=step).losses
           for _ in range(2)]
    assert own[0][0] != own[0][1] and own[0] == own[1]
    return program


def _sampler_draws(kernel: pb.Kernel, fetched: Sequence[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Per step, a sampled_logits kernel's replayed draw: TF's ids, then its tries (from the
    expected counts: 1 - (1 - p)^tries, or p * num_sampled when every try was kept)."""
    attrs = {key: from_attr(value) for key, value in kernel.attrs.items()}
    draws = []
    for step in fetched:
        ids, counts = step[f"{kernel.name}:0"], step[f"{kernel.name}:2"]
        tries = sampler_tries(Classes.of(attrs), ids, counts)
        draws.append(np.append(ids.astype(np.int64), tries))
    return draws


def sampler_tries(classes: Classes, ids: np.ndarray, counts: np.ndarray) -> int:
    """The tries a TF candidate sampler took for `ids`, told by its expected counts of them:
    p * num_sampled when every try was kept, else 1 - (1 - p)^tries."""
    p = classes.probability(ids).astype(np.float64)
    if np.allclose(counts, p * len(ids), rtol=1e-6):
        return len(ids)
    return int(np.round(np.median(np.log1p(-counts.astype(np.float64)) / np.log1p(-p))))


def _batch_first(drawn: np.ndarray, kernel: pb.Kernel | None) -> np.ndarray:
    """TF's draw with its batch axis first: a draw of K sets a sample stacked in front of the
    batch ([K, B, ...], its kernel's batch_axis 1) as each sample's [K, ...]."""
    if kernel is not None and "batch_axis" in kernel.attrs and \
            from_attr(kernel.attrs["batch_axis"]) == 1:
        return np.moveaxis(drawn, 1, 0)
    return drawn


@contextmanager
def tfs_draws(program: pb.Program, fetched: Sequence[dict[str, np.ndarray]],
              masks: Mapping[str, str] = {}) -> Iterator[None]:
    """Within the block the CS's drawing kernels return the numbers TF drew (`fetched`: per
    step or batch, by tensor: tf_reference.run's, fetching drawing_kernels' tensors); the
    weight program draws once a batch, the others each sample's in order (a dropout kernel
    without its mask in `masks` its own)."""
    drawing = drawing_kernels(program, masks)
    kernels = {k.name: k for k in program.kernels}
    once = {k.name for k in program.weight_program.kernels}
    queued = {name: [_batch_first(step[tensor], kernels.get(name))
                     for step in fetched] for name, tensor in drawing.items()}
    samplers = {k.name for k in program.kernels if k.type == "sampled_logits"}
    queued.update({k.name: _sampler_draws(k, fetched) for k in program.kernels
                   if k.name in samplers})
    taken = dict.fromkeys(drawing, 0)  # each kernel's values handed out so far, in sample order
    # a step minimizing several losses runs its forward pass once per loss: the same draws
    batch, passes = program.batch_size, max(len(program.objectives), 1)

    def replay(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        if name not in queued:  # (a dropout not replayed)
            return None
        if name in samplers:  # (one draw a step)
            taken[name] += 1
            return queued[name][taken[name] - 1]
        start, taken[name] = taken[name], taken[name] + shape[0]
        if name in once:
            return queued[name][start]
        values = np.concatenate(queued[name]).reshape(-1, *shape[1:])
        start = start // (batch * passes) * batch + start % batch
        return values[start:start + shape[0]]

    with replayed_draws(replay):
        yield


def compare_drawn(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                  steps: int = 4) -> Comparison:
    """compare(), with the CS's `random` kernels handed the raw numbers TF drew at each step,
    its `categorical` kernels the classes TF drew and its dropout kernels the uniform numbers
    of TF's masks (tfs_draws): the parity of everything but the draws."""
    compiled = compile_checked(model_fn, input_fn, params, model_dir)
    data = tf_reference.batches(input_fn, params, steps)
    masks = dropout_masks(model_fn, input_fn, params, compiled.program)
    reference = tf_reference.run(model_fn, input_fn, params, compiled.initial_weights, data,
                                 fetch=drawn_tensors(compiled.program, masks))
    with tfs_draws(compiled.program, reference.fetched, masks):
        cs = run_on_cs(compiled.program, compiled.initial_weights, data)
    return Comparison(compiled, cs, reference)


def assert_resume_is_unbroken(model_fn: Callable, input_fn: Callable, params: dict,
                               model_dir: str, slots: set[str]) -> None:
    """4 CS steps, a checkpoint holding `slots`, read back as the chief resumes: the next 4
    steps are those of an unbroken run, and TF resumed from the same state agrees (1e-5)."""
    compiled = compile_checked(model_fn, input_fn, params, model_dir)
    data = tf_reference.batches(input_fn, params, 8)
    first, state, resumed = resume_is_unbroken(compiled, data, model_dir, 4)
    assert slots <= set(first.state)
    reference = tf_reference.run(model_fn, input_fn, params,
                                 {**state, "global_step": np.int64(4)}, data[4:])
    np.testing.assert_allclose(resumed.losses, reference.losses, rtol=1e-5)


def resume_is_unbroken(compiled: CompileResult, data: Sequence[tuple[Any, Any]], model_dir: str,
                       at: int) -> tuple[CSRun, dict[str, np.ndarray], CSRun]:
    """`at` CS steps of `data`, a checkpoint of them read back as the chief resumes, and the
    rest of `data` resumed from it: asserts the losses and state are an unbroken run's, bit
    for bit (the same draws too); (the first run, the state resumed from, the resumed run)."""
    first = run_on_cs(compiled.program, compiled.initial_weights, data[:at])
    checkpoints.write_checkpoint(model_dir, at, {**first.state, "global_step": np.int64(at)},
                                 keep_max=None)
    path = checkpoints.checkpoint_path(model_dir, at)
    state = cs_state(compiled.program, checkpoints.read_checkpoint(path), path)
    resumed = run_on_cs(compiled.program, state, data[at:], global_step=at, first_batch=at)
    unbroken = run_on_cs(compiled.program, compiled.initial_weights, data)
    assert first.losses + resumed.losses == unbroken.losses
    for name, value in unbroken.state.items():
        np.testing.assert_array_equal(resumed.state[name], value, err_msg=name)
    return first, state, resumed


def cached_comparisons(cases: dict[str, tuple[Callable, Callable, dict]], base: dict,
                       tmp_path_factory: Any, steps: int = 4,
                       drawn: bool = False) -> Callable[[str], "Comparison"]:
    """compare() (drawn: compare_drawn()) of a module's named cases, each run once (for a
    module-scoped fixture)."""
    cache: dict[str, Comparison] = {}
    comparison = compare_drawn if drawn else compare

    def run(name: str) -> Comparison:
        if name not in cache:
            model_fn, input_fn, extra = cases[name]
            cache[name] = comparison(model_fn, input_fn, {**base, **extra},
                                     str(tmp_path_factory.mktemp(name)), steps=steps)
        return cache[name]
    return run


def micro_batch_comparisons(input_fn: Callable, tmp_path_factory: Any,
                            steps: int) -> Callable[..., Comparison]:
    """(model_fn, params, micro[, replicas]) -> compare() with the CS streaming micro-batches
    of `micro` (on `replicas` > 1: params' runconfig num_replicas); the compile, the batches and
    TF's training made once per (model_fn, params) for a module-scoped fixture: the
    micro-batch size changes only the CS's run."""
    cache: dict[tuple, tuple] = {}

    def run(model_fn: Callable, params: dict, micro: int,
            replicas: int | None = None) -> Comparison:
        if replicas not in (None, 1):
            params = {**params, "runconfig": {"num_replicas": replicas}}
        key = (model_fn, repr(params))
        if key not in cache:
            model_dir = str(tmp_path_factory.mktemp(model_fn.__name__))
            compiled = compile_checked(model_fn, input_fn, params, model_dir)
            data = tf_reference.batches(input_fn, params, steps)
            cache[key] = compiled, data, tf_reference.run(model_fn, input_fn, params,
                                                          compiled.initial_weights, data)
        compiled, data, reference = cache[key]
        cs = run_on_cs(at_micro_batch(compiled.program, micro), compiled.initial_weights, data)
        return Comparison(compiled, cs, reference)
    return run


def random_split_comparison(model_fn: Callable, input_fn: Callable, steps: int, seed: int,
                            model_dir: str) -> Comparison:
    """compare() of `steps` batches at a batch size of 4, 6 or 8 and a micro-batch size of 1,
    2 or the batch drawn from `seed` (differential tests of batch barriers)."""
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([4, 6, 8]))
    micro = int(rng.choice([m for m in (1, 2, batch) if batch % m == 0]))
    params = {"batch_size": batch}
    compiled = compile_checked(model_fn, input_fn, params, model_dir)
    data = tf_reference.batches(input_fn, params, steps)
    reference = tf_reference.run(model_fn, input_fn, params, compiled.initial_weights, data)
    cs = run_on_cs(at_micro_batch(compiled.program, micro), compiled.initial_weights, data)
    return Comparison(compiled, cs, reference)


def trained_checkpoint(model_dir: str, trained: Comparison, step: int = STEPS_WRITTEN) -> str:
    """What the chief writes after a CS run: the CS's state (weights and optimizer slots), the
    graph's host-side variables and the global step, as `model.ckpt-<step>` in model_dir."""
    state = {**trained.compiled.host_variables, **trained.cs.state, "global_step": np.asarray(step, np.int64)}
    checkpoints.write_checkpoint(model_dir, step, state, keep_max=None)
    return checkpoints.checkpoint_path(model_dir, step)


def first_batches(input_fn: Callable, params: dict, count: int) -> list[tuple[Any, Any]]:
    """The first `count` (features, labels) numpy batches as an input worker streams them."""
    dataset = input_dataset(input_fn, params).take(count)
    return [element if isinstance(element, tuple) else (element, None) for element in numpy_batches(dataset)]


def evaluate_like_the_chief(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                            checkpoint: str, steps: int) -> dict[str, float]:
    """The chief's evaluation of `checkpoint` on `steps` batches: the EVAL program loaded with
    its weights runs on the in-process CS, and the metrics come from its streamed outputs
    and losses (coordinator.chief.Chief.evaluate)."""
    compiled = compile_checked(model_fn, input_fn, params, model_dir, mode="eval")
    program = compiled.program
    stored = checkpoints.read_checkpoint(checkpoint)
    state = cs_state(program, stored, checkpoint)
    run = run_on_cs(program, state, first_batches(input_fn, params, steps), kind="evaluate",
                    global_step=resumed_step(checkpoint, stored))
    names = output_tensor_names(program)
    with EvalMetrics(model_fn, input_fn, params, checkpoint, streamed_names(program)) as metrics:
        for loss, outputs in zip(run.losses, run.outputs):
            metrics.update({**{names[n]: v for n, v in outputs.items()},
                            metrics.loss_name: np.asarray(loss, np.float32)})
        return metrics.results()


def evaluation_mismatch(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                        trained: Comparison, steps: int = 2, rtol: float = 1e-4,
                        global_step: int = STEPS_WRITTEN) -> str:
    """"" if the CS evaluates a checkpoint of the `trained` state at `global_step` (as the
    chief does) with the CPU path's metrics on that checkpoint (every metric, the mean loss
    included, to `rtol`); else what differs."""
    path = trained_checkpoint(model_dir, trained, global_step)
    settings = RunSettings(model_dir, params, None, None, None, None)
    cpu = cpu_session.evaluate(model_fn, input_fn, settings, steps=steps, checkpoint_path=path)
    cpu.pop("global_step")
    cs = evaluate_like_the_chief(model_fn, input_fn, params, model_dir, path, steps)
    if set(cs) != set(cpu) or not all(np.allclose(cs[k], cpu[k], rtol=rtol, atol=rtol * 1e-2) for k in cpu):
        return f"evaluation metrics: CS {cs} vs the CPU path {cpu}"
    return ""


def predict_like_the_chief(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                           checkpoint: str, steps: int) -> dict[str, np.ndarray]:
    """The chief's predictions of `checkpoint` on `steps` batches: the PREDICT program on the
    in-process CS, its streamed outputs fed to the host-side graph (Chief.predict)."""
    program = compile_checked(model_fn, input_fn, params, model_dir, mode="infer").program
    stored = checkpoints.read_checkpoint(checkpoint)
    state = cs_state(program, stored, checkpoint)
    run = run_on_cs(program, state, first_batches(input_fn, params, steps), kind="predict",
                    global_step=resumed_step(checkpoint, stored))
    names = output_tensor_names(program)
    signature = batch_signature(make_dataset(input_fn, params))
    with PredictionGraph(model_fn, signature, params, checkpoint, streamed_names(program)) as graph:
        batches = [graph.run({names[n]: v for n, v in outputs.items()}) for outputs in run.outputs]
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


def both_predictions(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                     trained: Comparison, steps: int = 2) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The CS's predictions (as the chief makes them) and the CPU path's from a checkpoint of
    the `trained` state."""
    path = trained_checkpoint(model_dir, trained)
    settings = RunSettings(model_dir, params, None, None, None, None)
    cs = predict_like_the_chief(model_fn, input_fn, params, model_dir, path, steps)
    cpu = cpu_session.predict(model_fn, input_fn, settings, checkpoint_path=path,
                              num_samples=len(next(iter(cs.values())))).arrays
    return cs, cpu


def prediction_mismatch(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                        trained: Comparison, steps: int = 2, rtol: float = 1e-4,
                        of_largest: bool = False) -> str:
    """"" if the CS predicts from a checkpoint of the `trained` state (as the chief does) what
    the CPU path predicts from it (integers exactly, floats to `rtol`, or with `of_largest` to
    `rtol` of each output's largest magnitude: float16 outputs, whose rounding is of their
    scale); else what differs."""
    cs, cpu = both_predictions(model_fn, input_fn, params, model_dir, trained, steps)
    problems = [] if set(cs) == set(cpu) else [f"keys: CS {sorted(cs)} vs the CPU path {sorted(cpu)}"]
    for key in sorted(set(cs) & set(cpu)):
        same = (cs[key].shape == cpu[key].shape and (
            np.array_equal(cs[key], cpu[key]) if cpu[key].dtype.kind in "iub"
            else np.allclose(cs[key], cpu[key], rtol=rtol, atol=rtol * (
                np.abs(cpu[key]).max(initial=0.0) if of_largest else 1e-2))))
        if not same:
            problems.append(f"{key}: CS {cs[key][:4]} vs the CPU path {cpu[key][:4]}")
    return "; ".join(problems)


def cpu_path_mismatches(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
                        trained: Comparison) -> list[str]:
    """Where the CS's evaluation and prediction of the `trained` state differ from the CPU
    path's (empty: both the same)."""
    return [problem for problem in (
        evaluation_mismatch(model_fn, input_fn, params, model_dir, trained),
        prediction_mismatch(model_fn, input_fn, params, model_dir, trained)) if problem]


def noise_floor_variables(compiled: CompileResult) -> set[str]:
    """The variables whose gradient elements at the noise level the CS sets to 0 exactly
    (a `noise_floor` gradient transform: coordinator/compiler/training/noise.py)."""
    assert compiled.program is not None
    return {v for t in compiled.program.gradient_transforms if t.kind == "noise_floor"
            for v in t.variables}


def _never_moved(state: dict[str, np.ndarray], name: str, start: np.ndarray,
                 decayed: bool) -> np.ndarray:
    """The elements of variable `name` the CS's state shows no gradient moved: its value
    the initial one, or (decayed: the decay moves it) every slot of it exactly 0."""
    still = np.asarray(state[name]) == np.asarray(start)
    slots = [np.asarray(v) for k, v in state.items() if k.startswith(name + "/")]
    if decayed and slots:
        still |= np.logical_and.reduce([slot == 0 for slot in slots])
    return still


def zero_gradient_variables(compiled: CompileResult) -> set[str]:
    """The variables the compiler gives the exact gradient 0 (a `zero` gradient transform:
    coordinator/compiler/training/shift.py)."""
    assert compiled.program is not None
    return {v for t in compiled.program.gradient_transforms if t.kind == "zero"
            for v in t.variables}


def mismatches(result: Comparison, rtol: float = 1e-4) -> list[str]:
    """Where the CS's training differs from TensorFlow's, one line each (empty: the same).

    Losses agree to `rtol`; every variable the CS holds agrees elementwise to `rtol` of its
    value plus `rtol` of the largest magnitude among its kind (all weights, or all slots of
    one name: near-zero entries such as an attention key bias, whose true gradient is 0,
    are rounding noise at that scale), and its change over the run to 1% of TF's largest
    change (a frozen weight that moved, an unclipped gradient). TF's optimizer slots of the
    CS's variables must be in the CS's state. A variable the compiler gives the exact
    gradient 0 (a softmax's shared shift) must equal its initial value, what exact
    arithmetic gives without weight decay (float32 TF's noise steps it by up to the learning
    rate); decayed (AdamW, a weight write) it is compared with nothing. An element of a
    variable under the noise floor (wafer.grad_transforms' `noise_floor`) that the CS never
    moved (its value the initial one; decayed: its optimizer slots all exactly 0, no
    gradient ever reached them) is not compared with TF's, which noise moved; its slots still
    are (TF's stay at the noise's size, or they differ)."""
    problems = []
    cs, ref, initial = result.cs, result.reference, result.compiled.initial_weights
    program = result.compiled.program
    zeroed = zero_gradient_variables(result.compiled)
    decayed = {w.variable for w in program.weight_writes} if program.optimizer.type != "adamw" \
        else zeroed
    for name in sorted(zeroed - decayed):
        if not np.array_equal(cs.state[name], initial[name]):
            problems.append(f"{name}: its gradient is 0 exactly, yet the CS moved it from "
                            f"{initial[name].ravel()[:1]} to {cs.state[name].ravel()[:1]}")
    losses, ref_losses = np.asarray(cs.losses, np.float64), np.asarray(ref.losses, np.float64)
    if losses.shape != ref_losses.shape or not np.allclose(
            losses, ref_losses, rtol=rtol, atol=rtol * 1e-2 * np.nanmax(np.abs(ref_losses), initial=0)):
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
    floored = noise_floor_variables(result.compiled)
    writes = {w.variable for w in program.weight_writes}
    for name, value in sorted(cs.state.items()):
        if name in zeroed:
            continue
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
        if name in floored:
            still = _never_moved(cs.state, name, initial[name], name in writes
                                 or program.optimizer.type == "adamw")
            bad &= ~still
            err = np.where(still, 0.0, err)
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


MIXED_FACTOR = 2.0  # (measured: docs/design.md, "Float16 convolution gradients")
MIXED_FLOOR = 2e-2
MIXED_SPREAD_RUNS = 4


@dataclass(frozen=True)
class Float32Twin:
    """The referee of a mixed_float16 training: TF's float32 run of the same model from the
    same initial weights and batches, and TF mixed's runs from those weights moved by half a
    float16 ULP (the spread of TF's own float16 rounding)."""
    float32: tf_reference.Reference
    half_ulp: list[tf_reference.Reference]


def float32_twin(model_fn: Callable, input_fn: Callable, params: dict, result: Comparison,
                 steps: int, runs: int = MIXED_SPREAD_RUNS) -> Float32Twin:
    """The twin of `result` (model_fn builds the float32 one under params["policy"] "float32");
    the half-ULP runs move a random half of every weight's elements by x(1 + 2^-11), seeds
    0..runs-1."""
    data = tf_reference.batches(input_fn, params, steps)
    initial = result.compiled.initial_weights
    float32 = tf_reference.run(model_fn, input_fn, {**params, "policy": "float32"}, initial, data,
                               strict=False)  # (without the loss scale a model wraps in mixed only)
    half_ulp = []
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        moved = {name: np.where(rng.random(np.shape(value)) < 0.5, value * np.float32(1 + 2.0 ** -11),
                                value).astype(np.float32) for name, value in initial.items()}
        half_ulp.append(tf_reference.run(model_fn, input_fn, params, moved, data))
    return Float32Twin(float32, half_ulp)


def twin_distances(run: CSRun | tf_reference.Reference, twin: dict[str, np.ndarray],
                   initial: dict[str, np.ndarray]) -> dict[str, float]:
    """Each floating variable's distance from `twin` (the float32 run's state): max |x - twin|
    over the twin's change of it (a weight) or its largest magnitude (a slot, a scalar)."""
    distances = {}
    for name in sorted(set(twin) & set(run.state)):
        if np.asarray(twin[name]).dtype.kind != "f":
            continue
        exact = np.asarray(twin[name], np.float64)
        scale = np.abs(exact - initial[name]).max(initial=0.0) if name in initial else np.abs(exact).max(initial=0.0)
        if scale > 0:  # (a weight no gradient moves, a slot that stays 0: nothing to judge)
            distances[name] = float(np.abs(np.asarray(run.state[name], np.float64) - exact).max() / scale)
    return distances


def mixed_precision_mismatches(result: Comparison, twin: Float32Twin, factor: float = MIXED_FACTOR,
                               floor: float = MIXED_FLOOR) -> list[str]:
    """A mixed_float16 training judged by the issue's rule, one line per difference (empty:
    the same): the losses within 1e-2 relative of TF mixed's (its run or one of the half-ULP
    runs), and every variable (weights and slots) no farther from the twin's float32 run than
    `factor` x the farthest TF mixed run plus `floor` (twin_distances; a variable the CS does
    not hold, which TF's runs leave at the twin's value, is not judged). For the runs whose
    elements `mismatches` finds apart by float16 rounding that TF's CPU kernels make
    otherwise (Eigen's float16 convolution gradients), which Adam grows over the steps."""
    references = [result.reference, *twin.half_ulp]
    cs = np.asarray(result.cs.losses, np.float64)
    if not any(cs.shape == np.shape(r.losses) and np.all(np.abs(cs - r.losses) <= 1e-2 * np.abs(r.losses))
               for r in references):
        problems = [f"losses: CS {cs.tolist()} vs TF mixed {result.reference.losses}"]
    else:
        problems = []
    initial, exact = result.compiled.initial_weights, twin.float32.state
    cs_run = twin_distances(result.cs, exact, initial)
    tf_runs = [twin_distances(r, exact, initial) for r in references]
    for name in sorted(tf_runs[0]):
        tf_run = max(run.get(name, 0.0) for run in tf_runs)
        if name not in result.cs.state and name not in initial and tf_run == 0.0:
            continue  # a variable the CS does not hold, which every TF run leaves at the twin's value
        if not cs_run.get(name, np.nan) <= factor * tf_run + floor:  # (NaN: farther)
            problems.append(f"{name}: CS {cs_run.get(name, np.nan):.3g} vs TF mixed {tf_run:.3g} "
                            "from the float32 run")
    return problems


def mixed_training_problems(model_fn: Callable, input_fn: Callable, params: dict,
                            result: Comparison, steps: int) -> list[str]:
    """A mixed_float16 training's differences from TF mixed: element by element at 1e-2,
    and where that fails, by the float32 twin's rule (mixed_precision_mismatches)."""
    problems = mismatches(result, 1e-2)
    if problems:  # float16 roundings apart (Eigen's float16 convolution gradients)
        problems = mixed_precision_mismatches(result, float32_twin(model_fn, input_fn, params, result, steps))
    return problems


def farther_than_tensorflow(result: Comparison, exact: dict[str, np.ndarray], factor: float,
                             floor: float = 0.0) -> list[str]:
    """The weights the CS trained farther from `exact` (a higher-precision run's state from
    the same weights and batches) than TensorFlow's run was, by more than `factor` (distance:
    max |w - exact| over max |exact|; below `floor` it is rounding noise), one line each.
    Weights `exact` has not, or never moved, are left out."""
    def distance(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

    farther = []
    for name, initial in sorted(result.compiled.initial_weights.items()):
        if name not in exact or np.abs(np.asarray(exact[name]) - initial).max() == 0:
            continue  # (no gradient: e.g. an attention key's bias, which softmax ignores)
        cs, tf_run = (distance(run.state[name], exact[name]) for run in (result.cs, result.reference))
        if cs > max(factor * tf_run, floor):
            farther.append(f"{name}: CS {cs:.3g} vs TF {tf_run:.3g} from the exact run")
    return farther


def assert_same_training(result: Comparison, rtol: float = 1e-4) -> None:
    """No mismatches; else they, and the compile's initial weights (drawn afresh in every
    process unless runconfig.tf_random_seed is set) to train from again."""
    problems = mismatches(result, rtol)
    assert not problems, (f"the CS trained differently from TensorFlow from the initial weights in "
                          f"{os.path.join(result.compiled.directory, WEIGHTS)}:\n  "
                          + "\n  ".join(problems))


def model_op_words(model_fn: Callable, input_fn: Callable, params: dict) -> set[str]:
    """What a refusal may name of model_fn's training graph: its op types (MatMul), its
    scoped op and variable names (dense/bias), its inputs (features, labels) and the ops of
    its tf.conds' branches (cond/sort/TopKV2) and of its While loops' bodies (a tf.map_fn's
    function, which the compiler builds again vectorized: map/loop_body/...)."""
    signature = batch_signature(make_dataset(input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        call_model_fn(model_fn, features, labels, "train", params)
        ops = graph.get_operations()
        branches = {(f"{op.name}/{inner.name}", inner.type) for op in ops
                    if op.type in ("If", "StatelessIf")
                    for branch in (op._true_graph, op._false_graph)
                    for inner in branch.get_operations()}  # (named as refusals name them)
        branches |= {(inner.name, inner.type) for op in ops if op.type in ("While", "StatelessWhile")
                     for inner in op._body_graph.get_operations()}
        return ({op.type for op in ops} | {op.name for op in ops if "/" in op.name}
                | {op.name for op in ops if op.type == "Placeholder"}
                | {t for name_type in branches for t in name_type})


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


def refusal(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str,
            source_file: str, mode: str = "train") -> str:
    """The one-line refusal of model_fn (written in `source_file`) compiled for `mode`,
    checked to name one of its ops and a line of that file (AssertionError if it compiles
    or does not)."""
    try:
        compile_checked(model_fn, input_fn, params, model_dir, mode=mode)
    except CSRunError as error:
        words = model_op_words(model_fn, input_fn, params)
        problem = refusal_problem(error, source_file, words)
        assert problem == "", problem
        return str(error)
    raise AssertionError(f"{model_fn.__name__} compiled: it should be refused")
