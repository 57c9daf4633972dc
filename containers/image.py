"""`make image`: the Charliecloud directory image built from the one recipe, `containers/csrun.def`.

Where Apptainer is installed, `apptainer build csrun.sif containers/csrun.def` builds it. Here
the same recipe's steps, as spython parses them, are applied to a Debian root file system:

1. base: `mmdebstrap --variant=minbase` of the Debian suite and packages that stand for the
   recipe's `From:` image (`BASES`; Debian's Python, pip allowed to install as root as in
   the python:*-slim images);
2. %files: copied from the csrun sources into the image;
3. %environment: written to the image's /ch/environment (`ch-run --set-env` applies it);
4. %post: run in the image (`ch-run -w`, traced with `sh -ex`), pip reaching the package
   registries exactly as the host's pip does: the host's pip settings (`pip config list`)
   pass as PIP_* variables, and the local indexes/wheel folders they name are bound.

The image is rebuilt only when the recipe or the pins (constraints.txt, setup.cfg,
pyproject.toml) change; when only the sources its %files copies change, they are copied
again and %post re-runs on the built image (pip then reinstalls just the project). A failing step stops the build,
naming the step and its output's last line (the whole output: `build.log` next to the image).

    python -m containers.image [--image DIR] [--force]
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.errors import ArgumentParser, CSRunError, cli_entry
from containers.recipes import DEFINITION, Definition, missing_sources, read_definition

ROOT = DEFINITION.parent.parent
DEFAULT_IMAGE = ROOT / ".cache" / "csrun-image"
PINS = ("constraints.txt", "setup.cfg", "pyproject.toml")
STAMP = "ch/csrun-image-stamp"  # inside the image: the hash it was built from
IGNORED = ("__pycache__", "*.pyc", "model_dir", "csrun_jobs")  # run output, never copied


@dataclass(frozen=True)
class Base:
    suite: str                 # the Debian release
    packages: tuple[str, ...]  # what mmdebstrap --include installs besides minbase


# A recipe's `From:` image and the Debian root that stands for it here.
BASES = {
    "python:3.11-slim-bookworm": Base("bookworm", ("python3", "python3-pip", "python-is-python3",
                                                   "ca-certificates")),
}


def stamp_of(definition: Definition, root: Path = ROOT) -> str:
    """"RECIPE SOURCES": the hash of the recipe and the pins, then of the files it copies."""
    recipe = hashlib.sha256(definition.path.read_bytes())
    for pin in PINS:
        recipe.update(pin.encode() + b"\0" + (root / pin).read_bytes())
    sources = hashlib.sha256()
    for source, _ in definition.files:
        path = root / source
        for file in sorted(p for p in path.rglob("*") if p.is_file() and not _ignored(p.relative_to(root))) \
                if path.is_dir() else [path]:
            sources.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return f"{recipe.hexdigest()} {sources.hexdigest()}"


def _ignored(path: Path) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in path.parts for pattern in IGNORED)


def image_stamp(image: Path) -> str | None:
    path = image / STAMP
    return path.read_text().strip() if path.is_file() else None


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise CSRunError(f"cannot build the image: {name} not found on PATH",
                         "run `make image` as root (it installs charliecloud-runtime and mmdebstrap)")
    return path


def run_step(step: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> str:
    """Run one build step, appending its output to `log`; stop naming it when it fails."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with log.open("a") as out:
        out.write(f"== {step}\n{done.stdout}")
    if done.returncode != 0:
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        traced = [line[2:] for line in lines if line.startswith("+ ")]
        where = f" at `{traced[-1]}`" if traced else ""
        last = next((line for line in reversed(lines) if not line.startswith("+ ")), "(no output)")
        raise CSRunError(f"image recipe step {step}{where} failed (exit {done.returncode}): {last.strip()}",
                         f"the step's whole output is in {log}")
    return done.stdout


def pip_settings() -> dict[str, str]:
    """The host pip's effective settings (files and PIP_* variables) as PIP_* variables."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    settings = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        settings[f"PIP_{name.upper().replace('-', '_')}"] = value.strip().strip("'\"")
    return settings


def registry_binds(settings: dict[str, str]) -> list[str]:
    """The host folders pip's settings name (file:// indexes, find-links, the CA file's folder)."""
    folders = []
    for value in settings.values():
        for item in value.split():
            path = item.removeprefix("file://")
            if path.startswith("/") and os.path.exists(path):
                folder = path if os.path.isdir(path) else os.path.dirname(path)
                if item.startswith("file://") and folder.endswith("/simple"):
                    folder = os.path.dirname(folder)  # the index's files sit beside simple/
                if folder not in folders:
                    folders.append(folder)
    return folders


def build_image(image: Path = DEFAULT_IMAGE, definition_path: Path = DEFINITION, root: Path = ROOT,
                force: bool = False) -> bool:
    """Build `image` from the recipe unless it is up to date; True when it was built."""
    definition = read_definition(definition_path)
    stamp, built = stamp_of(definition, root), image_stamp(image)
    if not force and built == stamp:
        return False
    # Only the copied sources changed: copy them again and re-run %post on the built image.
    refresh = not force and built is not None and built.split()[0] == stamp.split()[0]
    base = BASES.get(definition.base_image)
    if base is None:
        raise CSRunError(f"{definition.path}: no Debian base stands for From: {definition.base_image} here",
                         f"use one of {', '.join(BASES)}, or build with `apptainer build`")
    missing = missing_sources(definition, root)
    if missing:
        raise CSRunError(f"{definition.path}: %files sources missing below {root}: {', '.join(missing)}")
    mmdebstrap, ch_run = _tool("mmdebstrap"), _tool("ch-run")
    work = image.with_name(image.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    log = image.with_name(image.name + ".build.log")
    log.write_text("")
    if refresh:
        image.rename(work)
    else:
        run_step(f"From: {definition.base_image} (mmdebstrap {base.suite})",
                 [mmdebstrap, "--variant=minbase", f"--include={','.join(base.packages)}", base.suite,
                  str(work)], log)
        for marker in work.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()  # as in the python:*-slim images, pip installs as root
    for source, destination in definition.files:
        target = work / destination.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            shutil.rmtree(target)
        if (root / source).is_dir():
            shutil.copytree(root / source, target, ignore=shutil.ignore_patterns(*IGNORED))
        else:
            shutil.copy2(root / source, target)
    (work / "ch").mkdir(exist_ok=True)
    (work / "ch" / "environment").write_text("".join(
        f"{name}={value}\n" for name, value in environment_of(definition)))
    settings = pip_settings()
    binds = registry_binds(settings)
    for folder in binds:
        (work / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(settings, USER=os.environ.get("USER") or "root", HOME="/root")
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    mounts = [arg for folder in binds for arg in ("-b", f"{folder}:{folder}")]
    run_step("%post", [ch_run, "-w", *mounts, str(work), "--", "/bin/sh", "-exc", "\n".join(definition.post)],
             log, env)
    for folder in reversed(binds):  # the empty mount points are no part of the image
        path = work / folder.lstrip("/")
        while path != work and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
            path = path.parent
    (work / STAMP).write_text(stamp + "\n")
    shutil.rmtree(image, ignore_errors=True)
    work.rename(image)
    return True


def environment_of(definition: Definition) -> list[tuple[str, str]]:
    """The recipe's %environment assignments (`export NAME=VALUE` or `NAME=VALUE`)."""
    pairs = []
    for line in definition.environment:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        if words[0] == "export":
            words = words[1:]
        for word in words:
            name, equals, value = word.partition("=")
            if not equals:
                raise CSRunError(f"{definition.path}: cannot read %environment line {line!r}",
                                 "write NAME=VALUE assignments (optionally after export)")
            pairs.append((name, value))
    return pairs


@cli_entry("python -m containers.image")
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m containers.image", description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help=f"the directory image (default: {DEFAULT_IMAGE})")
    parser.add_argument("--definition", type=Path, default=DEFINITION)
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    built = build_image(args.image.resolve(), args.definition, force=args.force)
    state = f"built in {time.perf_counter() - start:.0f} s" if built else "up to date"
    print(f"{args.image}: {state} (from {args.definition})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
