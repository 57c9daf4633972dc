"""The chief-node compiler: extract -> match -> place -> emit, behind the compile cache.

    compile_model(model_fn, input_fn, params, model_dir, mode=..., validate_only=..., fabric=...)
    load_compiled(compile_dir)

Each pass is a function of the previous one's result (the typed forms of `ir.py`,
`extract.ExtractedGraph`, `placement.PlacedModel`, `artifacts.Artifacts`); `--validate_only`
stops after matching, `--compile_only` runs every pass. The cache (`artifacts.CompileCache`)
keeps the artifacts in `model_dir/cs_compile/<graph hash>/` and reuses them while the hash is
unchanged: place and emit run only on a miss.
"""
from __future__ import annotations

import os
from typing import Callable

from common.errors import CSRunError
from common.params_reads import say_once
from coordinator.compiler.artifacts import (
    VALIDATION_REPORT,
    CompileCache,
    CompileResult,
    damage_of,
    graph_hash,
    read_compile,
)
from coordinator.compiler.extract import extract
from coordinator.compiler.match import check_supported, match, unsupported_detail
from coordinator.compiler.placement import build_kernels, place_model
from coordinator.compiler.precision import check_config
from coordinator.compiler.program import emit
from coordinator.compiler.report import STILL_STATISTICS, still_statistics, validation_text
from coordinator.compiler.weights import initializer_summary
from coordinator.replicas import requested_replicas
from tf_model.estimator_spec import ModeKeys
from wafer.fabric import DEFAULT_FABRIC, FABRICS, Fabric

__all__ = ["CompileResult", "compile_model", "load_compiled"]


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
    check_config(params)
    replicas = requested_replicas(params.get("runconfig") or {})
    if replicas != 1 and mode != ModeKeys.TRAIN and not validate_only:
        say_once(params, f"multireplica is for training (as on the original CS system): {mode} runs "
                 "on one copy of the network")
        replicas = 1
    cache = CompileCache(model_dir)
    extracted = extract(model_fn, input_fn, params, mode)
    model = match(extracted)
    report = ""
    if model.unsupported:
        cache.write_validation_report("Validation failed\n" + unsupported_detail(model) + "\n")
        report = os.path.join(cache.root, VALIDATION_REPORT)
    check_supported(model, report)
    build_kernels(model)  # each kernel's configuration: what validates, loads
    if still := still_statistics(model):
        say_once(params, f"csrun: warning: batch normalization {', '.join(still)}: {STILL_STATISTICS} "
                 "(hint: compute them with tf.nn.moments and tf.compat.v1.train."
                 "assign_moving_average in UPDATE_OPS, or tf.compat.v1.nn.fused_batch_norm and "
                 "assign ops)")
    if validate_only:
        text = validation_text(model, mode, extracted.batch_size, fab)
        cache.write_validation_report(text)
        return CompileResult(cache.root, None, {}, {}, False, text)
    key = graph_hash(model, mode=mode, batch_size=extracted.batch_size, fabric=fab,
                     seed=extracted.seed, initializers=initializer_summary(extracted),
                     replicas=replicas)
    if (reused := cache.load(key)) is not None:
        return reused
    placed = place_model(model, fab, mode, batch_size=extracted.batch_size, replicas=replicas)
    artifacts = emit(placed, extracted, name=os.path.basename(os.path.abspath(model_dir)),
                     graph_hash=key)
    return cache.store(key, artifacts)


def load_compiled(compile_dir: str) -> CompileResult:
    """A compile directory written by compile_model, read back."""
    if (damage := damage_of(compile_dir)) is not None:
        raise CSRunError(f"{compile_dir} is not a complete compile directory: {damage}",
                         "compile again with --compile_only")
    return read_compile(compile_dir)
