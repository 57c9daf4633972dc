"""Emit: a placed model's artifacts — the CS API Program message, the initial weights, the
compile reports and the wafer map."""
from __future__ import annotations

from typing import Sequence

from coordinator.compiler import report, wafer_map
from coordinator.compiler.artifacts import Artifacts
from coordinator.compiler.extract import ExtractedGraph
from coordinator.compiler.ir import MatchedModel, ParamRef, TrainingSpec, WeightProgram
from coordinator.compiler.placement import PlacedModel, Placement, Rect
from coordinator.compiler.weights import host_variables, initial_weights
from cs_api import cs_api_pb2 as pb
from cs_api.attrs import to_attr
from cs_api.tensors import dtype_code, to_tensor
from wafer import loss_scaling

# Micro-batches of up to 256 samples: on the host, bigger GEMMs beat fuller stages, since
# threads share a region's GEMM tiles (FC-MNIST batch 256 on 2 threads, one bench run: 58
# steps/s at micro 32, 74 at 64, 71 at 128, 86 at 256; TensorFlow 80). The long parity runs
# (tests/wse_sim/test_wse_parity.py, the differential and silent corpora) pass at 256.
MAX_MICRO_BATCH = 256


def micro_batch_size(batch_size: int) -> int:
    """The largest divisor of the batch not above MAX_MICRO_BATCH."""
    return max(d for d in range(1, min(batch_size, MAX_MICRO_BATCH) + 1) if batch_size % d == 0)


def emit(placed: PlacedModel, extracted: ExtractedGraph, *, name: str,
         graph_hash: str) -> Artifacts:
    """The artifacts of `placed`; the initial weights are the values of `extracted`'s graph."""
    model, placement, fab, mode = placed.model, placed.placement, placed.fabric, placed.mode
    batch_size = extracted.batch_size
    program = build_program(model, placement, name=name, graph_hash=graph_hash, fabric=fab.name,
                            batch_size=batch_size, seed=extracted.seed)
    derived = model.weight_program.derived if model.weight_program is not None else frozenset()
    weights = [p.variable for k in model.kernels for p in k.params if p.variable not in derived]
    if model.weight_program is not None:
        weights += [p.variable for p in model.weight_program.sources]
    if model.training is not None:
        weights += model.training.state_variables
        weights += [w for t in model.training.transforms for w in t.weights]
    return Artifacts(
        program=program,
        initial_weights=initial_weights(extracted, weights),
        host_variables=initial_weights(extracted, host_variables(extracted, weights)),
        report_text=report.compile_text(model, placement, fab, mode=mode, batch_size=batch_size,
                                        graph_hash=graph_hash),
        report_json=report.compile_json(model, placement, fab, mode=mode, batch_size=batch_size,
                                        graph_hash=graph_hash),
        wafer_map_png=wafer_map.render(fab, [k.name for k in model.kernels],
                                       [k.type for k in model.kernels], placement.regions,
                                       placement.routes, program.name,
                                       placement.replica_offsets, placement.tile))


def build_program(model: MatchedModel, placement: Placement, *, name: str, graph_hash: str,
                  fabric: str, batch_size: int, seed: int | None) -> pb.Program:
    replicas = placement.replicas
    program = pb.Program(name=name, graph_hash=graph_hash, fabric=fabric, batch_size=batch_size,
                         micro_batch_size=micro_batch_size(batch_size // replicas),
                         loss_kernel=model.loss_kernel,
                         reported_loss_kernel=model.reported_loss_kernel, outputs=list(model.outputs),
                         seed=int(seed or 0), num_replicas=replicas)
    if replicas > 1:
        program.replica_offsets.extend(pb.Point(x=x, y=y) for x, y in placement.replica_offsets)
    program.inputs.extend(spec.to_proto() for spec in model.inputs)
    timings = placement.timing.kernels
    for i, node in enumerate(model.kernels):
        rect = placement.regions[i]
        kernel = program.kernels.add(
            name=node.name, type=node.type, inputs=list(node.inputs),
            output_shape=list(node.output_shape),
            region=pb.Region(x=rect.x, y=rect.y, width=rect.width, height=rect.height),
            source=node.source, flops_per_sample=timings[i].flops_per_sample,
            samples_per_sec=timings[i].samples_per_sec,
            memory_per_core_bytes=placement.memory_per_core[i], tf_tensor=node.tf_tensor)
        for key, value in node.attrs.items():
            kernel.attrs[key].CopyFrom(to_attr(value))
        for p in node.params:
            _add_param(kernel, p)
    if model.weight_program is not None:
        emit_weight_program(program, model.weight_program, placement.weight_regions)
    if model.training is not None:
        emit_training(program, model.training, model.weight_program)
    for route in placement.routes:
        program.routes.add(src=route.src, dst=route.dst,
                           path=[pb.Point(x=x, y=y) for x, y in route.path],
                           bytes_per_sample=route.bytes_per_sample, replica=route.replica,
                           bytes_per_batch=route.bytes_per_batch)
    t = placement.timing
    program.estimate.CopyFrom(pb.Estimate(
        samples_per_sec=t.samples_per_sec, compute_samples_per_sec=t.compute_samples_per_sec,
        transmission_samples_per_sec=t.transmission_samples_per_sec,
        active_cores=t.active_cores, compute_utilization=t.compute_utilization,
        ideal_samples_per_sec=placement.fabric_bound, pipeline_fill_seconds=t.fill_seconds))
    return program


def _add_param(kernel: pb.Kernel | pb.WeightProgram, p: ParamRef) -> None:
    params = kernel.sources if isinstance(kernel, pb.WeightProgram) else kernel.params
    param = params.add(
        role=p.role, variable=p.variable, shape=list(p.shape), dtype=dtype_code(p.dtype),
        frozen=p.frozen, regularizers=[pb.Regularizer(kind=kind, scale=scale,
                                                    unreported=not p.penalty_reported)
                                       for kind, scale in p.regularizers])
    if p.variable_shape is not None and (tuple(p.variable_shape) != tuple(p.shape)
                                         or p.view is not None):
        param.variable_shape.extend(p.variable_shape)
        param.scalar_variable = not p.variable_shape and bool(p.shape)
    if p.view is not None:
        param.view.CopyFrom(to_tensor("view", p.view))


def emit_weight_program(program: pb.Program, weights: WeightProgram,
                        regions: Sequence[Rect]) -> None:
    """The weight program: its sources, and its kernels, each on the region it is charged to."""
    program.weight_program.CopyFrom(weight_program_message(weights, regions))


def weight_program_message(weights: WeightProgram,
                           regions: Sequence[Rect] = ()) -> pb.WeightProgram:
    """The message of a weight program (a gradient program's: with no regions)."""
    message = pb.WeightProgram()
    for p in weights.sources:
        _add_param(message, p)
    for k, node in enumerate(weights.kernels):
        kernel = message.kernels.add(
            name=node.name, type=node.type, inputs=list(node.inputs),
            output_shape=list(node.output_shape), source=node.source, tf_tensor=node.tf_tensor)
        if regions:
            rect = regions[k]
            kernel.region.CopyFrom(pb.Region(x=rect.x, y=rect.y, width=rect.width,
                                             height=rect.height))
        for key, value in node.attrs.items():
            kernel.attrs[key].CopyFrom(to_attr(value))
    return message


def emit_training(program: pb.Program, training: TrainingSpec,
                  weights: WeightProgram | None = None) -> None:
    """The optimizer, each param's frozen/update (frozen: constant-like, or not updated by
    the train_op; a derived weight: when none of its sources is trained) and the gradient
    transforms."""
    program.optimizer.CopyFrom(training.optimizer.to_message())
    program.optimizer_groups.extend(g.to_message() for g in training.optimizer_groups)
    program.objectives.extend(pb.Objective(loss_kernel=o.loss_kernel, variables=list(o.variables))
                              for o in training.objectives)
    program.reupdates.extend(r.to_message() for r in training.reupdates)
    held = {p.variable for k in program.kernels for p in k.params} | {
        p.variable for p in program.weight_program.sources}
    for t in training.transforms:  # (a weight only a gradient program reads: a pruning mask)
        for source in t.program.sources if t.program is not None else ():
            if source.variable in t.weights and source.variable not in held:
                program.weight_program.sources.add().CopyFrom(source)
                held.add(source.variable)
    for param in program.weight_program.sources:
        param.frozen = param.frozen or not training.update(param.variable)
        param.update = "" if param.frozen else training.update(param.variable)
    for kernel in program.kernels:
        for param in kernel.params:
            if weights is not None and param.variable in weights.derived:
                param.frozen = not any(training.update(var)
                                       for var in weights.sources_of(param.variable))
                continue
            param.frozen = param.frozen or not training.update(param.variable)
            param.update = "" if param.frozen else training.update(param.variable)
    program.gradient_transforms.extend(t.to_message() for t in training.transforms)
    program.schedules.extend(s.to_message(pb) for s in training.schedules)
    program.moving_averages.extend(m.to_message(pb) for m in training.moving_averages)
    program.weight_writes.extend(w.to_message(pb) for w in training.weight_writes)
    if training.conditional_update is not None:
        program.conditional_update.CopyFrom(training.conditional_update.to_message(pb))
    if training.dynamic_loss_scale is not None:
        loss_scaling.set_in_program(program, training.dynamic_loss_scale, pb)
    program.step_counts_applied = training.step_counts_applied
