"""The site's `csrun.yaml`: what the original installation's admin variables held.

The first file that exists of `$CSRUN_CONFIG`, `./csrun.yaml`, `~/.config/csrun/csrun.yaml`,
`/etc/csrun/csrun.yaml` is read (none: the defaults). One loader builds the frozen
dataclasses below from it and rejects unknown keys and wrong types, naming the key and
the file. A relative image or CA path is relative to the file. The documented example is
`slurm/csrun.example.yaml`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from common import task_env
from common.errors import CSRunError
from containers.runtime import RUNTIMES

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED/INFINITE.
_SLURM_TIME = re.compile(r"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite)", re.I)


@dataclass(frozen=True)
class ContainerConfig:
    image: str | None = None    # the image tasks run in (.sif, or a directory); None: no container
    runtime: str | None = None  # "apptainer" | "singularity" | "charliecloud" | None (whichever is on PATH)


@dataclass(frozen=True)
class SlurmConfig:
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    partition: str | None = None
    gres: str | None = "cs:1"    # the CS system as a Slurm GRES: two jobs never share one
    gres_node: str | None = None  # the node that holds the CS GRES (the chief runs there)
    time: str | None = None       # Slurm --time
    licenses: str | None = None   # the CS system as a cluster license (e.g. "cs:1"), several nodes
    requeue: bool = False         # a job Slurm signals (time limit, preemption) checkpoints and requeues


@dataclass(frozen=True)
class CSConfig:
    tls_ca: str | None = None  # PEM CA of the CS systems' certificates: clients speak TLS and verify


# Set by csrun_wse for its tasks: the CA its CS speaks TLS with ("": no TLS, e.g. the
# embedded simulator on loopback); unset: csrun.yaml's cs.tls_ca.


@dataclass(frozen=True)
class SiteConfig:
    path: Path | None = None  # the file read; None: the defaults
    container: ContainerConfig = field(default_factory=ContainerConfig)
    mount_dirs: tuple[str, ...] = ()  # bound into the container besides the current directory
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    cs: CSConfig = field(default_factory=CSConfig)


def config_candidates(environ: Mapping[str, str], cwd: Path) -> list[Path]:
    """Where csrun.yaml is looked for, in order."""
    home = Path(environ.get("HOME") or Path.home())
    return [cwd / "csrun.yaml", home / ".config" / "csrun" / "csrun.yaml",
            Path("/etc/csrun/csrun.yaml")]


def load_site_config(environ: Mapping[str, str] | None = None, cwd: Path | str | None = None) -> SiteConfig:
    """The site configuration from the first csrun.yaml found, or the defaults."""
    import yaml

    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else Path(cwd)
    if environ.get("CSRUN_CONFIG"):
        path = cwd / Path(environ["CSRUN_CONFIG"]).expanduser()
        if not path.is_file():
            raise CSRunError(f"CSRUN_CONFIG names {path}, which is not a file",
                             "point CSRUN_CONFIG at a csrun.yaml, or unset it")
    else:
        found = next((p for p in config_candidates(environ, cwd) if p.is_file()), None)
        if found is None:
            return SiteConfig()
        path = found
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise CSRunError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise CSRunError(f"{path} is not valid YAML{where}: {getattr(error, 'problem', error)}",
                         "fix the file (see slurm/csrun.example.yaml)") from None
    config = _build(SiteConfig, {} if data is None else data, "", path)
    return dataclasses.replace(
        config, path=path,
        container=dataclasses.replace(config.container, image=_resolve(config.container.image, path)),
        cs=dataclasses.replace(config.cs, tls_ca=_resolve(config.cs.tls_ca, path)))


def _resolve(value: str | None, path: Path) -> str | None:
    """A path from the file: relative ones are relative to the file."""
    if value is None:
        return None
    resolved = Path(value).expanduser()
    return str(resolved if resolved.is_absolute() else path.parent / resolved)


def cs_tls_ca(environ: Mapping[str, str] | None = None) -> str | None:
    """The CA a client of the CS verifies its certificate with (None: no TLS)."""
    environ = os.environ if environ is None else environ
    if task_env.CS_TLS_CA in environ:
        return environ[task_env.CS_TLS_CA] or None
    return load_site_config(environ).cs.tls_ca


def _build(cls: type, data: Any, prefix: str, path: Path) -> Any:
    """An instance of dataclass `cls` from a YAML mapping; every key checked against it."""
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, dict):
        raise CSRunError(f"{path}: {where} must be a mapping, not {_kind(data)}",
                         "see slurm/csrun.example.yaml")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name != "path"]
    values = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in known:
            raise CSRunError(f"{path}: unknown key {name!r}",
                             f"the keys{' of ' + where if prefix else ''} are: {', '.join(known)}")
        values[key] = _value(hints[key], value, name, path)
    return cls(**values)


def _value(hint: Any, value: Any, name: str, path: Path) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, {} if value is None else value, f"{name}.", path)
    if hint == tuple[str, ...]:  # a list of strings, or one comma-separated string
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise _wrong(name, path, "a list of paths", value)
        return tuple(i.strip() for i in items if i.strip())
    optional = type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise _wrong(name, path, _expected(hint), value)
    if hint is bool:
        if not isinstance(value, bool):
            raise _wrong(name, path, "true or false", value)
        return value
    if int in (hint, *typing.get_args(hint)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _wrong(name, path, "a whole number of at least 1", value)
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _wrong(name, path, "a string", value)
    return _checked_string(name, str(value), path)


def _checked_string(name: str, value: str, path: Path) -> str:
    if name == "container.runtime" and value not in RUNTIMES:
        raise CSRunError(f"{path}: container.runtime is {value!r}",
                         f"use one of {', '.join(RUNTIMES)}, or leave it out to use whichever is installed")
    if name == "slurm.time" and not _SLURM_TIME.fullmatch(value):
        raise CSRunError(f"{path}: slurm.time {value!r} is not a Slurm time",
                         "use minutes, HH:MM:SS or D-HH:MM:SS, e.g. 1-00:00:00")
    if not value.strip():
        raise CSRunError(f"{path}: {name} is empty", "give a value or leave the key out")
    return value


def _expected(hint: Any) -> str:
    return "a whole number of at least 1" if hint is int else "a string"


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"


def _wrong(name: str, path: Path, expected: str, value: Any) -> CSRunError:
    return CSRunError(f"{path}: {name} must be {expected}, not {_kind(value)}",
                      "see slurm/csrun.example.yaml")
