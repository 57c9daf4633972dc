"""compile_report.txt and compile_report.json: the original's shape, plus the bounds."""
from __future__ import annotations

import json
from typing import Any

from coordinator.compiler.ir import KernelNode, MatchedModel, TrainingSpec
from coordinator.compiler.placement import Placement
from coordinator.compiler.training.shift import REASON
from cs_api.attrs import from_attr
from tf_model.keras_regularizers import UNPENALIZED, UNPENALIZED_HINT
from wafer import timing
from wafer.fabric import Fabric
from wafer.kernels import build_kernel
from wafer.kernels.batch_tail import source_name
from wafer.kernels.losses import divisor_programs
from wafer.kernels.step_values import STEP_VALUE
from wafer.loss_scaling import CS1DynamicLossScale, Rule
from wafer.optimizers import OptimizerConfig
from wafer.precision import is_half, precision_of
from wafer.schedules import Schedule, ScheduleError, attr_programs, evaluate, render
from wafer.weight_writes import describe

# Steps at which the compile report shows each schedule's value.
REPORT_STEPS = (0, 1, 2, 3, 10, 100, 1000, 10000, 100000)

MB = 1024 * 1024


def _n(value: float) -> str:
    return f"{value:,.0f}"


def fabric_line(fabric: Fabric) -> str:
    return (f"fabric {fabric.name}: {fabric.width} x {fabric.height} cores, "
            f"{fabric.sram_per_core // 1024} KB SRAM per core ({fabric.sram_bytes / 2**30:.1f} GB), "
            f"{fabric.clock_hz / 1e9:g} GHz, {fabric.flops_per_cycle:g} FLOP/cycle/core at "
            f"efficiency {fabric.efficiency:g}")


def model_summary(model: MatchedModel, mode: str, batch_size: int) -> list[str]:
    lines = [f"Mode: {mode}, batch size {batch_size}, "
             f"{len(model.kernels)} kernels, {model.num_parameters:,} parameters"]
    lines.append("Inputs: " + ", ".join(f"{s.name} {s.shape} {s.dtype}" for s in model.inputs))
    if model.training is not None:
        lines += training_lines(model, model.training)
    if model.loss_kernel:
        loss = next(k for k in model.kernels if k.name == model.loss_kernel)
        terms = loss.inputs[:len(loss.attrs["divided_by"])] if "divisors" in loss.attrs else loss.inputs
        if loss.type == "batch_tail_loss":
            lines += batch_tail_lines(loss)
        else:
            lines.append(f"Loss: the sum over the batch of {', '.join(terms)} "
                         f"x {loss.attrs['scale']:.6g}")
        lines += divisor_lines(loss)
        lines += step_value_lines(model)
        penalties = list(dict.fromkeys(f"{kind} {scale:g} on {p.variable}" for k in model.kernels
                                       for p in k.params for kind, scale in p.regularizers))
        if penalties:
            lines.append("Weight penalties: " + ", ".join(penalties))
    lines += weight_lines(model)
    if model.outputs:
        lines.append("Streamed back to the host: " + ", ".join(model.outputs))
    return lines


def weight_lines(model: MatchedModel) -> list[str]:
    """Weights read by several kernels (held by the first) and static views of weights."""
    readers: dict[str, list[str]] = {}
    for k in model.kernels:
        for p in k.params:
            readers.setdefault(p.variable, []).append(k.name)
    lines = [f"Shared weight {var}: held by {names[0]}, read over the fabric by "
             + ", ".join(names[1:]) for var, names in readers.items() if len(names) > 1]
    lines += [f"View of {p.variable} {p.variable_shape}: {p.shape} in {k.name}"
              for k in model.kernels for p in k.params if p.view is not None]
    program = model.weight_program
    if program is not None:
        lines.append(f"Weight program (computed from {', '.join(p.variable for p in program.sources)} "
                     f"before every batch; their gradients taken back through it): "
                     f"{len(program.kernels)} kernels")
        lines += [f"  {k.name} = {_weight_kernel(k.type, k.attrs)}({', '.join(k.inputs)}) "
                  f"{k.output_shape}, read by {', '.join(readers[k.name])}" if k.name in readers
                  else f"  {k.name} = {_weight_kernel(k.type, k.attrs)}({', '.join(k.inputs)}) "
                  f"{k.output_shape}" for k in program.kernels]
    return lines


def _weight_kernel(kind: str, attrs: dict[str, Any]) -> str:
    """A weight program kernel in a word: its op or function."""
    return str(attrs.get("function") or attrs.get("op") or kind)


def _values(schedule: Schedule) -> str:
    """A schedule's values at REPORT_STEPS (or why it has none)."""
    try:
        return ", ".join(f"step {s}: {evaluate(schedule, s, {}):.6g}" for s in REPORT_STEPS)
    except ScheduleError as error:
        return str(error)


def step_value_lines(model: MatchedModel) -> list[str]:
    """The values of the global step the samples meet (`schedule` kernels), two lines each."""
    lines = []
    for k in model.kernels:
        if k.type != "schedule":
            continue
        (program,) = attr_programs(k.attrs["program"], STEP_VALUE)
        readers = ", ".join(r.name for r in model.kernels if k.name in r.inputs)
        lines.append(f"Value of the global step {program.tf_tensor} at {program.source} "
                     f"({len(program.ops)} scalar ops, evaluated at the step computed, in "
                     f"evaluation the checkpoint's; read by {readers}): {render(program)}")
        lines.append(f"  at {_values(program)}")
    return lines


def batch_tail_lines(loss: KernelNode) -> list[str]:
    """A loss evaluated once per batch (wafer.kernels.batch_tail): what it reads, its kernels."""
    steps = json.loads(loss.attrs["steps"])
    names = {source_name(j): name for j, name in enumerate(loss.inputs)}
    lines = [f"Loss: evaluated once per batch from the whole batch's {', '.join(loss.inputs)} "
             f"(a batch barrier; its gradient taken back to every sample): {len(steps)} kernels"]
    lines += [f"  {s['name']} = {_weight_kernel(s['type'], s['attrs'])}"
              f"({', '.join(names.get(i, i) for i in s['inputs'])})" for s in steps]
    return lines


def divisor_lines(loss: KernelNode) -> list[str]:
    """The loss's divisors of the batch (wafer.kernels.losses.BatchLoss), one line each."""
    if "divisors" not in loss.attrs:
        return []
    divided_by = list(loss.attrs["divided_by"])
    sums = loss.inputs[len(divided_by):]
    lines = []
    for r, (program, no_nan) in enumerate(zip(divisor_programs(loss.attrs["divisors"]),
                                              loss.attrs["div_no_nan"])):
        terms = ", ".join(t for t, g in zip(loss.inputs, divided_by) if g == r)
        read = sorted({o.name for o in program.ops if o.op == "input"})
        where = ", ".join(f"{name} = the batch's sum of {sums[int(name[1:])]}" for name in read)
        lines.append(f"  {terms} divided by {render(program)}{' (0 where it is 0)' * bool(no_nan)}"
                     f", computed before each batch from its inputs: {where} ({program.tf_tensor} "
                     f"at {program.source})")
    return lines


STILL_STATISTICS = ("the train_op moves no moving statistics toward its batch statistics (e.g. "
                    "Keras 3's BatchNormalization in a tf.compat.v1 graph leaves its updates out "
                    "of UPDATE_OPS): an evaluation normalising with moving statistics reads their "
                    "initial values, as on the CPU")


def still_statistics(model: MatchedModel) -> list[str]:
    """The batch normalizations in training whose moving statistics the train_op never moves."""
    return [k.name for k in model.kernels if k.type == "batch_norm_training"
            and not k.attrs["mean_update"] and not k.attrs["variance_update"]]


def _optimizer(o: OptimizerConfig, training: TrainingSpec, index: int = 0) -> str:
    """An optimizer's type and hyper-parameters, as the report shows them (`index`: of the
    program's optimizer 0, of its group index - 1)."""
    scheduled = {s.hyper_parameter for s in training.schedules if s.optimizer == index}
    l2 = "from a schedule" if "l2" in scheduled else f"{o.l2:g}"
    extra = {"sgd": "", "momentum": f", momentum {o.momentum:g}"
             f"{', nesterov' if o.use_nesterov else ''}",
             "adam": f", beta1 {o.beta1:g}, beta2 {o.beta2:g}, epsilon {o.epsilon:g}",
             "rmsprop": f", decay {o.decay:g}, momentum {o.momentum:g}, epsilon {o.epsilon:g}"
             f"{', centered' if o.centered else ''}",
             "adagrad": f", initial accumulator {o.initial_accumulator_value:g}",
             "adadelta": f", rho {o.decay:g}, epsilon {o.epsilon:g}",
             "ftrl": f", lr_power {o.lr_power:g}, l1 {o.l1:g}, l2 {l2}, l2_shrinkage "
             f"{o.l2_shrinkage:g}, initial accumulator {o.initial_accumulator_value:g}",
             "proximal_adagrad": f", l1 {o.l1:g}, l2 {o.l2:g}, initial accumulator "
             f"{o.initial_accumulator_value:g}",
             "proximal_sgd": f", l1 {o.l1:g}, l2 {o.l2:g}",
             "adamw": f", beta1 {o.beta1:g}, beta2 {o.beta2:g}, epsilon {o.epsilon:g}, "
             f"weight decay {o.weight_decay_rate:g}"
             + (f" (not of {', '.join(o.no_weight_decay)})" if o.no_weight_decay else "")
             + (", bias correction" if o.use_bias_correction else "")}[o.type]
    rate = "from a schedule" if "learning_rate" in scheduled else f"{o.learning_rate:g}"
    return f"{o.type}, learning rate {rate}{extra}"


def training_lines(model: MatchedModel, training: TrainingSpec) -> list[str]:
    """The optimizer, the trained and frozen weights and the gradient transforms."""
    lines = [f"Optimizer: {_optimizer(training.optimizer, training)}"]
    if training.optimizer_groups:
        named = {v for g in training.optimizer_groups for v in g.variables}
        rest = [v.name for v in training.variables if v.name not in named]
        passes = "one backward pass of the loss; " if not training.objectives else ""
        lines = [f"Optimizers ({passes}each updates its variables from the gradients before "
                 f"the step): {_optimizer(training.optimizer, training)} for {', '.join(rest)}"]
        lines += [f"  {_optimizer(g.config, training, k + 1)} for "
                  f"{', '.join(g.variables) or '(reupdates only)'}"
                  + (f" (step counters {', '.join(g.config.scalar_names)})"
                     if g.config.scalar_names else "")
                  for k, g in enumerate(training.optimizer_groups)]
    if training.reupdates:
        lines.append("Reupdates (a weight updated again after its first update, in TF's order, "
                     "from its loss's gradient before the step, with its optimizer's own "
                     "slots): " + "; ".join(
                         f"{r.variable} by optimizer {r.optimizer} from objective {r.objective} "
                         f"at {r.source}" for r in training.reupdates))
    if training.objectives:
        lines.append("Objectives (several losses minimized in one step: a backward pass of each "
                     "from the step's forward activations, then the updates): " + "; ".join(
                         f"{o.loss} at {o.source} (kernel {o.loss_kernel}) for "
                         f"{', '.join(o.variables)}" for o in training.objectives))
    if model.reported_loss_kernel:
        lines.append(f"Loss: trains on the loss the optimizer minimizes (kernel "
                     f"{model.loss_kernel}), reports the one model_fn returns (kernel "
                     f"{model.reported_loss_kernel}), both from the step's forward pass")
    sparse = [v.name for v in training.variables if v.update == "sparse"]
    lines.append(f"Trained weights: {len(training.variables)}"
                 + (f" (sparse updates: {', '.join(sparse)})" if sparse else ""))
    moving = {a.variable: a for a in training.statistic_averages}
    derived = model.weight_program.derived if model.weight_program is not None else frozenset()
    frozen = list(dict.fromkeys(p.variable for k in model.kernels for p in k.params
                                if p.variable not in training.trained and p.variable not in moving
                                and p.variable not in derived))
    if frozen:
        lines.append("Frozen weights (not updated by the train_op): " + ", ".join(frozen))
    rules = {"affine": "v * {0:g} + batch * {1:g}", "delta": "v - (v - batch) * {0:g}"}
    for a in training.statistic_averages:
        lines.append(f"Moving statistic: {a.variable} = {rules[a.update].format(*a.constants)} "
                     f"(each training batch, at its batch barrier)")
    lines.extend(f"Batch normalization {name}: {STILL_STATISTICS}" for name in still_statistics(model))
    if model.unpenalized_regularizers:
        lines.append(f"Weights {', '.join(model.unpenalized_regularizers)}: {UNPENALIZED} "
                     f"({UNPENALIZED_HINT})")
    for t in training.transforms:
        if t.kind == "zero":
            lines.extend(f"{v}: gradient 0 exactly ({REASON})" for v in t.variables)
            continue
        if t.kind == "noise_floor":
            lines.extend(f"{v}: noise floor (gradient elements at most {t.value:g} of the "
                         "model's largest set to 0 exactly: rounding noise of a sum a batch "
                         "normalization cancels, which the optimizer would amplify)"
                         for v in t.variables)
            continue
        if t.kind == "program" and t.program is not None:
            kernels = ", ".join(_weight_kernel(k.type, {key: from_attr(v) for key, v in
                                                        k.attrs.items()})
                                for k in t.program.kernels)
            lines.append(f"Gradient transform: program of {t.variables[0]} ({kernels}; reads "
                         f"{', '.join(s.variable for s in t.program.sources)}; at "
                         f"{t.program.kernels[-1].source})")
            continue
        what = {"scale": f"scale {t.value:g}", "clip_by_value": f"clip_by_value [{t.low:g}, "
                f"{t.high:g}]", "clip_by_norm": f"clip_by_norm {t.value:g}",
                "clip_by_global_norm": f"clip_by_global_norm {t.value:g}"}[t.kind]
        lines.append(f"Gradient transform: {what} of {', '.join(t.variables)}")
    for schedule in training.schedules:
        lines.append(f"Schedule of {schedule.hyper_parameter} ({schedule.tf_tensor} at "
                     f"{schedule.source}, {len(schedule.ops)} scalar ops evaluated before "
                     f"every step): {render(schedule)}")
        if not schedule.variables:
            lines.append(f"  {schedule.hyper_parameter} at {_values(schedule)}")
    groups: dict[tuple, list[str]] = {}
    for average in training.moving_averages:
        groups.setdefault((average.factor.ops, average.step_offset), []).append(average.shadow)
    for average in training.moving_averages:
        shadows = groups.pop((average.factor.ops, average.step_offset), None)
        if shadows:
            lines.append(f"Moving averages (after every update, shadow -= (shadow - weight) * "
                         f"{render(average.factor)}"
                         + (", at the incremented global step" if average.step_offset else "")
                         + f"): {', '.join(shadows)}")
    condition = training.conditional_update
    if condition is not None:
        when = f"{condition.finite} finite" if condition.predicate is None else \
            render(condition.predicate)
        lines.append(f"Updates inside a tf.cond (at {condition.source}): when {when}"
                     + (", at the incremented global step" if condition.step_offset else "")
                     + (f", applying the sums of {', '.join(a for _, a in condition.accumulators)}"
                        if condition.accumulators else "")
                     + (f"; only then: {', '.join(condition.if_true)}" if condition.if_true
                        else "")
                     + (f"; only otherwise: {', '.join(condition.if_false)}"
                        if condition.if_false else ""))
    for write in training.weight_writes:
        when = "before" if write.before_update else "after"
        what = (f"State write of {write.variable} from the whole batch (after the step's "
                "updates" if write.batch else
                f"State write of {write.variable}, {write.carried_dtype} (after the writes "
                "reading it" if write.carried_dtype else
                f"Soft update of {write.variable} (after the updates, reading the weights "
                f"{when} theirs" if write.sources else
                f"Weight write of {write.variable} ({when} every update")
        when = f", when {render(write.predicate)}" if write.predicate is not None else ""
        lines.append(f"{what}{when}, at {write.source}): w = {describe(write)}"
                     + (" (factors at the incremented global step)" if write.step_offset else ""))
    return lines


def validation_text(model: MatchedModel, mode: str, batch_size: int, fabric: Fabric) -> str:
    lines = ["Validation successful", *model_summary(model, mode, batch_size), fabric_line(fabric),
             "", f"{'kernel':<28} {'type':<30} {'inputs':<28} {'output':<14} source"]
    for k in model.kernels:
        lines.append(f"{k.name:<28} {k.type:<30} {', '.join(k.inputs):<28} "
                     f"{str(k.output_shape):<14} {k.source}")
    return "\n".join(lines) + "\n"


def replica_lines(placement: Placement, fabric: Fabric, batch_size: int) -> list[str]:
    """Multireplica: how many copies, where, and why that many (none without multireplica)."""
    t, count = placement.timing, placement.replicas
    lines = []
    if count > 1:
        tile = placement.tile or (fabric.width, fabric.height)
        lines.append(
            f"Replicas: {count} copies of the network (multireplica), each on a tile of "
            f"{tile[0]} x {tile[1]} cores at {_n(t.replica_samples_per_sec)} samples/s, each "
            f"taking {batch_size // count} consecutive samples of every batch of {batch_size}; "
            f"their gradients are summed (all-reduce {1e6 * t.allreduce_seconds:.3f} us) before "
            "the one update")
    elif placement.replica_candidates:
        floor = sum(timing.min_cores_for_memory(m, fabric) for m in placement.memory_bytes)
        if 2 * floor > fabric.cores:
            why = (f"the model is too big to replicate: one copy needs {_n(floor)} of the "
                   f"{_n(fabric.cores)} cores of {fabric.name} for its memory alone")
        elif len(placement.replica_candidates) == 1:
            why = (f"no number of copies that divides the batch size {batch_size} fits on "
                   f"{fabric.name}")
        else:
            why = f"one copy gives the fastest step of {batch_size} samples"
        lines.append(f"Replicas: 1 (multireplica asked for; {why})")
    if len(placement.replica_candidates) > 1:
        lines.append(f"Replica counts weighed (modelled samples/s of a step of {batch_size}): "
                     + ", ".join(f"{r}: {_n(rate)}" for r, rate in placement.replica_candidates)
                     + f"; chosen: {count}")
    return lines


def compile_json(model: MatchedModel, placement: Placement, fabric: Fabric, *, mode: str,
                 batch_size: int, graph_hash: str) -> dict[str, Any]:
    t = placement.timing
    return {
        "graph_hash": graph_hash, "fabric": fabric.name, "mode": mode, "batch_size": batch_size,
        "num_parameters": model.num_parameters,
        "optimizer": None if model.optimizer is None else vars(model.optimizer),
        "optimizer_groups": [{"optimizer": vars(g.config), "variables": list(g.variables)}
                             for g in (model.training.optimizer_groups if model.training else ())],
        "reported_loss_kernel": model.reported_loss_kernel,
        "objectives": [{"loss": o.loss, "loss_kernel": o.loss_kernel, "variables": list(o.variables)}
                       for o in (model.training.objectives if model.training else ())],
        "reupdates": [{"variable": r.variable, "optimizer": r.optimizer,
                       "objective": r.objective, "slots": list(r.slots), "source": r.source}
                      for r in (model.training.reupdates if model.training else ())],
        "estimate": {
            "samples_per_sec": t.samples_per_sec,
            "compute_samples_per_sec": t.compute_samples_per_sec,
            "transmission_samples_per_sec": t.transmission_samples_per_sec,
            "active_cores": t.active_cores,
            "compute_utilization": t.compute_utilization,
            "fabric_bound_samples_per_sec": placement.fabric_bound,
            "balanced_bound_samples_per_sec": placement.balanced_bound,
            "fraction_of_fabric_bound": t.compute_samples_per_sec / placement.fabric_bound,
            "fraction_of_balanced_bound": placement.quality,
            "pipeline_fill_seconds": t.fill_seconds,
            "update_seconds": t.update_seconds,
            "step_seconds": t.step_seconds(batch_size),
            "barrier_seconds": {b.name: b.stall_seconds(batch_size, t.samples_per_sec, t.replicas)
                                for b in t.barriers},
            "memory_bytes": placement.replicas * sum(placement.memory_bytes),
            "fabric_sram_bytes": fabric.sram_bytes,
        },
        "replicas": {
            "count": placement.replicas, "samples_per_batch": batch_size // placement.replicas,
            "offsets": [list(o) for o in placement.replica_offsets],
            "tile": list(placement.tile) if placement.tile else None,
            "samples_per_sec_each": t.replica_samples_per_sec,
            "allreduce_seconds": t.allreduce_seconds,
            "candidates": [list(c) for c in placement.replica_candidates],
        },
        "kernels": [{
            "name": k.name, "type": k.type, "precision": precision_of(k.attrs), "inputs": list(k.inputs),
            "output_shape": list(k.output_shape), "source": k.source,
            "region": {"x": r.x, "y": r.y, "width": r.width, "height": r.height},
            "cores": r.cores, "useful_cores": kt.useful_cores,
            "flops_per_sample": kt.flops_per_sample, "t_comp": kt.t_comp, "t_comm": kt.t_comm,
            "samples_per_sec": kt.samples_per_sec, "memory_per_core_bytes": mem,
        } for k, r, kt, mem in zip(model.kernels, placement.regions, t.kernels,
                                   placement.memory_per_core)],
    }


def compile_text(model: MatchedModel, placement: Placement, fabric: Fabric, *, mode: str,
                 batch_size: int, graph_hash: str) -> str:
    t = placement.timing
    step = t.step_seconds(batch_size)
    replicated = placement.replicas > 1
    lines = [
        f"Compile successful: graph {graph_hash}",
        *model_summary(model, mode, batch_size),
        fabric_line(fabric),
        "",
        "Estimated Overall Performance",
        f"  Samples/s:               {_n(t.samples_per_sec)}",
        f"  Compute Samples/s:       {_n(t.compute_samples_per_sec)}",
        f"  Transmission Samples/s:  {_n(t.transmission_samples_per_sec)}",
        f"  Active PEs:              {_n(t.active_cores)} of {_n(fabric.cores)} "
        f"({100 * t.active_cores / fabric.cores:.2f} %)",
        f"  Compute Utilization:     {100 * t.compute_utilization:.1f} % of the active PEs' peak",
        f"  Ideal bound:             {_n(placement.fabric_bound)} samples/s = cores x FLOP rate / "
        f"FLOPs per sample ({_n(fabric.cores)} x {fabric.core_flops_per_sec:.3g} / "
        f"{t.flops_per_sample:,.0f}); this placement reaches "
        f"{100 * t.compute_samples_per_sec / placement.fabric_bound:.2f} %",
        f"  Balanced-pipeline bound: {_n(placement.balanced_bound)} samples/s (within the "
        f"kernels' parallelism and memory); this placement reaches {100 * placement.quality:.1f} %",
        f"  Step time (batch {batch_size}):  {1e3 * step:.4f} ms = {batch_size - t.replicas} x "
        f"{1e9 / t.samples_per_sec:.1f} ns + fill {1e6 * t.fill_seconds:.3f} us + "
        + (f"all-reduce {1e6 * t.allreduce_seconds:.3f} us + " if t.replicas > 1 else "")
        + f"update {1e6 * t.update_seconds:.3f} us"
        + (f" + weight program {1e6 * t.weight_program_seconds:.3f} us"
           if model.weight_program is not None else "")
        + (f" + batch barriers {1e6 * t.barrier_seconds(batch_size):.3f} us" if t.barriers
           else "")
        + (f" + state writes {1e6 * t.state_write_seconds:.3f} us" if t.state_write_seconds
           else "") + f" ({_n(1 / step)} steps/s)",
        *[f"  Batch barrier: {b.name} ({b.holds}): the batch waits "
          f"{b.passes} x {batch_size - t.replicas} x {1e9 / t.samples_per_sec:.1f} ns + "
          f"transfers {1e6 * b.sync_seconds:.3f} us = "
          f"{1e6 * b.stall_seconds(batch_size, t.samples_per_sec, t.replicas):.3f} us per step"
          for b in t.barriers],
        f"  Memory:                  {placement.replicas * sum(placement.memory_bytes) / MB:,.2f} MB of "
        f"{fabric.sram_bytes / MB:,.0f} MB SRAM (weights, gradients, optimizer slots, "
        "activations in flight" + (f"; {placement.replicas} replicas" if placement.replicas > 1 else "")
        + ")",
        *(f"  {line}" for line in replica_lines(placement, fabric, batch_size)),
        *_precision_lines(model),
        *_weight_program_lines(model, placement, fabric, mode),
        "",
        f"{'kernel':<28} {'type':<28} "
        f"{'rectangle (x,y w x h)' + (' of replica 0' if replicated else ''):<24} {'cores':>8} "
        f"{'samples/s':>14} {'mem/core':>9}  source",
    ]
    for k, r, kt, mem in zip(model.kernels, placement.regions, t.kernels,
                             placement.memory_per_core):
        rect = f"{r.x},{r.y} {r.width}x{r.height}"
        kind = k.type + (" (float16)" if is_half(k.attrs) else "")
        lines.append(f"{k.name:<28} {kind:<28} {rect:<24} {r.cores:>8,} "
                     f"{_n(kt.samples_per_sec):>14} {mem / 1024:>7.1f}KB  {k.source}")
    lines.append("")
    several = mode == "train" and model.training is not None and bool(model.training.objectives)
    lines.append(f"Timing model (wafer/timing.py): t_comp = F_k / (useful cores x "
                 f"{fabric.flops_per_cycle:g} FLOP/cycle x {fabric.clock_hz / 1e9:g} GHz x "
                 f"eta {fabric.efficiency:g}), F_k = "
                 f"{timing.TRAIN_FLOPS_FACTOR if mode == 'train' else 1} x forward FLOPs"
                 f"{' ((1 + 2 n) x, n the losses whose backward pass reaches it)' if several else ''}; "
                 "t_comm = bytes per sample / (edge cores x 4 B x f); Samples/s = "
                 f"min({f'{placement.replicas} replicas x ' if replicated else ''}1 / max_k t_k, "
                 "I/O bytes/s / bytes per sample)")
    return "\n".join(lines) + "\n"


def _weight_program_lines(model: MatchedModel, placement: Placement, fabric: Fabric,
                          mode: str) -> list[str]:
    """The weight program's cost: its FLOPs, where they run, its time once a step."""
    program = model.weight_program
    if program is None:
        return []
    kernels = [build_kernel(k.type, k.name, k.attrs, k.input_shapes) for k in program.kernels]
    flops = sum(k.flops_per_sample() for k in kernels) * (
        timing.TRAIN_FLOPS_FACTOR if mode == "train" else 1)
    where = sorted({f"{r.x},{r.y} {r.width}x{r.height}" for r in placement.weight_regions})
    return [f"  Weight program:          {len(kernels)} kernels, {flops:,.0f} FLOPs once a step "
            f"({'forward and backward' if mode == 'train' else 'forward'}) on the region"
            f"{'s' if len(where) > 1 else ''} of its readers ({'; '.join(where)}): "
            f"{1e6 * placement.timing.weight_program_seconds:.3f} us a step"]


def _rule_text(rule: Rule) -> str:
    """A dynamic loss scaling rule in a few words."""
    if isinstance(rule, CS1DynamicLossScale):
        return (f"the CS-1's rule: a non-finite global norm skips the step, / 2 when more than "
                f"{rule.overflow_tolerance:g} of the steps since the last change overflowed, "
                f"x 2 after {rule.increment_period} steps, within [{rule.min_scale:g}, "
                f"{rule.max_scale:g}]")
    return (f"x {rule.multiplier:g} after {rule.increment_period} finite steps, "
            f"/ {rule.multiplier:g} and the step skipped on a non-finite gradient")


def _precision_lines(model: MatchedModel) -> list[str]:
    """Mixed precision, when the model has float16 kernels: how many, and the loss scale."""
    half = sum(is_half(k.attrs) for k in model.kernels)
    if not half:
        return []
    scale = model.training.loss_scale if model.training is not None else 1.0
    dynamic = model.training.dynamic_loss_scale if model.training is not None else None
    scaling = (f"; loss scale {scale:g}" if scale != 1.0 else "") if dynamic is None else \
        f"; dynamic loss scale from {scale:g} ({_rule_text(dynamic)})"
    return [f"  Precision:               {half} of {len(model.kernels)} kernels in float16 "
            f"(float16 operands and results, float32 accumulation; float32 master weights "
            f"and optimizer); weights and activations of float16 kernels at 2 B" + scaling]
