"""The compile cache `model_dir/cs_compile/<graph hash>/`: a compile's key, its artifacts
written atomically (temporary directory, then rename) with their checksums, and read back
while the key is unchanged and every file matches its checksum (a damaged entry is compiled
again, saying so)."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import CSRunError
from coordinator.compiler.ir import MatchedModel
from cs_api import cs_api_pb2 as pb
from wafer.fabric import Fabric
from wafer.kernels import base as kernel_base

COMPILER_VERSION = 4  # bump when the compiler's output changes for an unchanged graph
PROGRAM = "program.pb"
WEIGHTS = "initial_weights.npz"
HOST_VARIABLES = "host_variables.npz"  # the graph's variables the CS does not hold
REPORT_TXT = "compile_report.txt"
REPORT_JSON = "compile_report.json"
WAFER_MAP = "placement.png"
VALIDATION_REPORT = "validation_report.txt"
CHECKSUMS = "checksums.json"  # sha256 of each file a compile is read back from, written last
_READ_BACK = (PROGRAM, WEIGHTS, HOST_VARIABLES, REPORT_TXT, REPORT_JSON)


@dataclass(frozen=True)
class Artifacts:
    """What the emit pass writes: the files of a compile directory."""

    program: pb.Program
    initial_weights: dict[str, np.ndarray]  # the CS's weights: TF variable name -> initial value
    host_variables: dict[str, np.ndarray]  # the graph's other variables (e.g. a dropout seed state)
    report_text: str
    report_json: dict[str, Any]
    wafer_map_png: bytes


@dataclass(frozen=True)
class CompileResult:
    """What compile_model returns and load_compiled reads back."""

    directory: str  # the compile directory (cs_compile/ itself after validate_only)
    program: pb.Program | None  # None after validate_only
    initial_weights: dict[str, np.ndarray]  # the CS's weights: TF variable name -> initial value
    host_variables: dict[str, np.ndarray]  # the graph's other variables (e.g. a dropout seed state)
    reused: bool  # an unchanged graph's earlier compile was reused
    report_text: str
    note: str = ""  # one line a run says besides the report (a damaged compile compiled again)


class CompileCache:
    """`model_dir/cs_compile/`: one directory per graph hash, reused while it is complete,
    and the validation report beside them."""

    def __init__(self, model_dir: str):
        self.root = compile_root(model_dir)
        self.damaged = ""  # what `load` found damaged, said in the next compile's report

    def directory(self, key: str) -> str:
        return os.path.join(self.root, key)

    def write_validation_report(self, text: str) -> None:
        write_text_atomic(os.path.join(self.root, VALIDATION_REPORT), text)

    def load(self, key: str) -> CompileResult | None:
        """The earlier compile under `key`, or None when there is no complete one."""
        directory = self.directory(key)
        if not os.path.isdir(directory):
            return None
        if (damage := damage_of(directory)) is not None:
            self.damaged = f"The compile in {directory} is damaged ({damage}): compiled it again"
            return None
        reused = read_compile(directory)
        note = (f"Reusing the compile in {directory}: graph, shapes, hyper-parameters and "
                "fabric unchanged\n")
        return dataclasses.replace(reused, report_text=note + reused.report_text)

    def store(self, key: str, artifacts: Artifacts) -> CompileResult:
        """Write `artifacts` as the compile under `key`."""
        directory = self.directory(key)
        try:
            write_compile(directory, artifacts)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            size = (artifacts.program.ByteSize() + len(artifacts.wafer_map_png)
                    + sum(np.asarray(w).nbytes for w in artifacts.initial_weights.values()))
            raise CSRunError(f"no space left on the device of {self.root} to write the compile "
                             f"(it needs about {size / 1e6:,.1f} MB)",
                             "free space there, or use another model_dir") from None
        return CompileResult(directory, artifacts.program, artifacts.initial_weights,
                             artifacts.host_variables, False,
                             (self.damaged + "\n" if self.damaged else "") + artifacts.report_text
                             + f"Compile artifacts written to {directory}\n", self.damaged)


def compile_root(model_dir: str) -> str:
    return os.path.join(model_dir, "cs_compile")


def graph_hash(model: MatchedModel, *, mode: str, batch_size: int, fabric: Fabric,
               seed: int | None, initializers: list[Any], replicas: int | None = 1) -> str:
    """Key of a compile: the kernels, shapes, hyper-parameters, initializers, fabric and
    the replicas asked for (None: the compiler's choice)."""
    key = {
        "compiler": COMPILER_VERSION,
        "min_flops_per_core": kernel_base.MIN_FLOPS_PER_CORE,
        "mode": mode, "batch_size": batch_size, "seed": seed,
        "fabric": dataclasses.asdict(fabric),
        "inputs": [dataclasses.asdict(s) for s in model.inputs],
        "kernels": [{k: v for k, v in dataclasses.asdict(node).items() if k != "source"}
                    for node in model.kernels],
        "loss_kernel": model.loss_kernel, "outputs": list(model.outputs),
        "training": None if model.training is None else dataclasses.asdict(model.training),
        "initializers": initializers,
    }
    if model.reported_loss_kernel:
        key["reported_loss_kernel"] = model.reported_loss_kernel
    if model.unpenalized_regularizers:  # (the report names them)
        key["unpenalized_regularizers"] = list(model.unpenalized_regularizers)
    if replicas != 1:  # (one copy keeps the keys of compiles before multireplica)
        key["replicas"] = "auto" if replicas is None else replicas
    if model.weight_program is not None:
        key["weight_program"] = dataclasses.asdict(model.weight_program)
    text = json.dumps(key, sort_keys=True, default=_json_value)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json_value(value: Any) -> Any:
    """Arrays (constants in kernel attributes) by their dtype, shape and full contents."""
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        return [array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest()]
    return str(value)


def damage_of(directory: str) -> str | None:
    """What is wrong with a compile directory (a file missing, or not what was written), None
    when every file it is read back from matches its checksum."""
    try:
        with open(os.path.join(directory, CHECKSUMS)) as f:
            expected = json.load(f)
    except FileNotFoundError:
        return f"{CHECKSUMS} is missing"
    except (OSError, ValueError):
        return f"{CHECKSUMS} is unreadable"
    for name in _READ_BACK:
        try:
            if _sha256(os.path.join(directory, name)) != expected.get(name):
                return f"{name} differs from its checksum"
        except FileNotFoundError:
            return f"{name} is missing"
    return None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_compile(directory: str, artifacts: Artifacts) -> None:
    """Write all artifacts into a temporary sibling, then rename it to `directory`.

    A concurrent compile of the same graph that finished first wins; its artifacts are
    identical.
    """
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.", dir=parent)
    try:
        with open(os.path.join(tmp, PROGRAM), "wb") as f:
            f.write(artifacts.program.SerializeToString())
        np.savez(os.path.join(tmp, WEIGHTS), allow_pickle=False, **artifacts.initial_weights)
        np.savez(os.path.join(tmp, HOST_VARIABLES), allow_pickle=False, **artifacts.host_variables)
        with open(os.path.join(tmp, REPORT_TXT), "w") as f:
            f.write(artifacts.report_text)
        with open(os.path.join(tmp, REPORT_JSON), "w") as f:
            json.dump(artifacts.report_json, f, indent=2)
        with open(os.path.join(tmp, WAFER_MAP), "wb") as f:
            f.write(artifacts.wafer_map_png)
        with open(os.path.join(tmp, CHECKSUMS), "w") as f:
            json.dump({name: _sha256(os.path.join(tmp, name)) for name in _READ_BACK}, f, indent=2)
        if os.path.isdir(directory):  # an incomplete leftover: replace it
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old.", dir=parent)
            os.rename(directory, os.path.join(old, "dir"))
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, directory)
        except OSError:
            if damage_of(directory) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_compile(directory: str) -> CompileResult:
    """A complete compile directory, read back."""
    return CompileResult(directory, read_program(directory), read_weights(directory),
                         read_weights(directory, HOST_VARIABLES), True, read_report(directory))


def read_program(directory: str) -> pb.Program:
    program = pb.Program()
    with open(os.path.join(directory, PROGRAM), "rb") as f:
        program.ParseFromString(f.read())
    return program


def read_weights(directory: str, name: str = WEIGHTS) -> dict[str, np.ndarray]:
    with np.load(os.path.join(directory, name)) as data:
        return {k: data[k] for k in data.files}


def read_report(directory: str) -> str:
    with open(os.path.join(directory, REPORT_TXT)) as f:
        return f.read()
