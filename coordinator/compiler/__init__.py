"""The chief-node compiler: extract -> match kernels -> place -> emit.

    compile_model(model_fn, input_fn, params, model_dir, mode=..., validate_only=..., fabric=...)
    load_compiled(compile_dir)

Each pass is a function over the typed intermediate form of `ir.py`; `--validate_only`
stops after matching, `--compile_only` runs every pass. Artifacts go to
`model_dir/cs_compile/<graph hash>/` and are reused while the hash is unchanged.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from common.errors import CSRunError
from coordinator.compiler import artifacts, report, wafer_map
from coordinator.compiler.extract import extract
from coordinator.compiler.ir import MatchedModel
from coordinator.compiler.match import check_supported, match, unsupported_detail
from coordinator.compiler.placement import Placement, TooLargeError, place
from coordinator.compiler.program import build_program
from coordinator.compiler.weights import host_variables, initial_weights, initializer_summary
from cs_api import cs_api_pb2 as pb
from tf_model.estimator_spec import ModeKeys
from wafer import timing
from wafer.fabric import DEFAULT_FABRIC, FABRICS, Fabric
from wafer.kernels import KernelError, build_kernel

__all__ = ["CompileResult", "compile_model", "load_compiled"]


@dataclass(frozen=True)
class CompileResult:
    directory: str  # the compile directory (cs_compile/ itself after validate_only)
    program: pb.Program | None  # None after validate_only
    initial_weights: dict[str, np.ndarray]  # the CS's weights: TF variable name -> initial value
    host_variables: dict[str, np.ndarray]  # the graph's other variables (e.g. a dropout seed state)
    reused: bool  # an unchanged graph's earlier compile was reused
    report_text: str


def resolve_fabric(params: dict, fabric: str) -> Fabric:
    """`runconfig.fabric` from params if given, else the `fabric` argument."""
    name = (params.get("runconfig") or {}).get("fabric") or fabric
    if name not in FABRICS:
        raise CSRunError(f"unknown fabric {name!r}",
                         f"set runconfig.fabric to one of {', '.join(FABRICS)}")
    return FABRICS[name]


def compile_model(model_fn: Callable, input_fn: Callable, params: dict, model_dir: str, *,
                  mode: str = ModeKeys.TRAIN, validate_only: bool = False,
                  fabric: str = DEFAULT_FABRIC) -> CompileResult:
    """Validate (and unless validate_only, compile) model_fn for the CS system.

    Raises CSRunError for unsupported ops (every one listed in the error's detail and in
    the report), a model too large for the fabric, or input_fn batches model_fn rejects.
    """
    fab = resolve_fabric(params, fabric)
    extracted = extract(model_fn, input_fn, params, mode)
    model = match(extracted)
    root = artifacts.compile_root(model_dir)
    if model.unsupported:
        artifacts.write_text_atomic(os.path.join(root, artifacts.VALIDATION_REPORT),
                                    "Validation failed\n" + unsupported_detail(model) + "\n")
    check_supported(model)
    build_kernels(model)
    if validate_only:
        text = report.validation_text(model, mode, extracted.batch_size, fab)
        artifacts.write_text_atomic(os.path.join(root, artifacts.VALIDATION_REPORT), text)
        return CompileResult(root, None, {}, {}, False, text)
    key = artifacts.graph_hash(model, mode=mode, batch_size=extracted.batch_size, fabric=fab,
                               seed=extracted.seed, initializers=initializer_summary(extracted))
    directory = os.path.join(root, key)
    if artifacts.is_complete(directory):
        reused = load_compiled(directory)
        note = f"Reusing the compile in {directory}: graph, shapes, hyper-parameters and fabric unchanged\n"
        return CompileResult(directory, reused.program, reused.initial_weights,
                             reused.host_variables, True, note + reused.report_text)
    placement, kernels = place_model(model, fab, mode)
    program = build_program(model, placement, name=os.path.basename(os.path.abspath(model_dir)),
                            graph_hash=key, fabric=fab.name, batch_size=extracted.batch_size,
                            seed=extracted.seed)
    variables = [p.variable for k in model.kernels for p in k.params]
    weights = initial_weights(extracted, variables)
    host = initial_weights(extracted, host_variables(extracted, variables))
    text = report.compile_text(model, placement, fab, mode=mode,
                               batch_size=extracted.batch_size, graph_hash=key)
    data = report.compile_json(model, placement, fab, mode=mode,
                               batch_size=extracted.batch_size, graph_hash=key)
    artifacts.write_compile(
        directory, program, weights, host, text, data,
        lambda path: wafer_map.render(path, fab, [k.name for k in model.kernels],
                                      [k.type for k in model.kernels], placement.regions,
                                      placement.routes, program.name))
    return CompileResult(directory, program, weights, host, False,
                         text + f"Compile artifacts written to {directory}\n")


def build_kernels(model: MatchedModel) -> list:
    """The library kernels of `model` (their cost model is what placement reads), built with
    the dtypes flowing from the inputs, as the CS builds them at Load: what validates, loads."""
    built = []
    dtypes = {spec.name: np.dtype(spec.dtype) for spec in model.inputs}
    for node in model.kernels:
        try:
            kernel = build_kernel(node.type, node.name, node.attrs, node.input_shapes)
            dtypes[node.name] = kernel.output_dtype([dtypes[i] for i in node.inputs])
        except KernelError as error:
            raise CSRunError(f"kernel {node.name} ({node.type}) at {node.source}: {error}",
                             "change the layer's configuration to one the kernel supports") from None
        if tuple(kernel.output_shape) != tuple(node.output_shape):
            raise RuntimeError(f"kernel {node.name}: library output shape {kernel.output_shape} "
                               f"differs from TensorFlow's {node.output_shape}")
        built.append(kernel)
    return built


def place_model(model: MatchedModel, fab: Fabric, mode: str) -> tuple[Placement, list]:
    """Build the kernels of `model` and place them on `fab` (CSRunError if it does not fit)."""
    kernels = build_kernels(model)
    training = mode == ModeKeys.TRAIN
    optimizer = model.optimizer.type if model.optimizer is not None else "sgd"
    input_names = [s.name for s in model.inputs]
    edges = [(src, node.name) for node in model.kernels for src in node.inputs]
    input_bytes = sum(math.prod(s.shape) * timing.BYTES_PER_VALUE for s in model.inputs)
    try:
        placement = place(kernels, fab, training=training, optimizer=optimizer,
                          input_bytes_per_sample=input_bytes, input_names=input_names,
                          edges=edges)
    except TooLargeError as error:
        gb = 2 ** 30
        raise CSRunError(
            f"the model does not fit on {fab.name}: it needs {error.needed_bytes / gb:,.2f} GB of "
            f"SRAM for {model.num_parameters:,} parameters (weights, gradients"
            f"{', ' + optimizer + ' slots' if optimizer != 'sgd' else ''} and activations in "
            f"flight; largest kernel {error.worst}), the fabric has {fab.sram_bytes / gb:,.2f} GB "
            f"({fab.width} x {fab.height} cores x {fab.sram_per_core // 1024} KB)",
            "pipelined mode is for models below about a billion parameters: make the model "
            "smaller") from None
    return placement, kernels


def load_compiled(compile_dir: str) -> CompileResult:
    """A compile directory written by compile_model, read back."""
    if not artifacts.is_complete(compile_dir):
        raise CSRunError(f"{compile_dir} is not a complete compile directory",
                         "compile again with --compile_only")
    return CompileResult(compile_dir, artifacts.read_program(compile_dir),
                         artifacts.read_weights(compile_dir),
                         artifacts.read_weights(compile_dir, artifacts.HOST_VARIABLES), True,
                         artifacts.read_report(compile_dir))

