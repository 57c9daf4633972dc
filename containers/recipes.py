"""Definition files read and converted with spython: check that `csrun.def` parses and
that what its %files copies exists, or turn a site's Dockerfile into a definition file.

    python -m containers check [DEF] [--root DIR]   # default: containers/csrun.def
    python -m containers convert Dockerfile [-o OUT.def]
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from common.errors import CSRunError

DEFINITION = Path(__file__).with_name("csrun.def")


@dataclass(frozen=True)
class Definition:
    path: Path
    base_image: str                      # From: of the docker bootstrap
    files: tuple[tuple[str, str], ...]   # %files (source on the build host, destination)
    post: tuple[str, ...]                # %post lines
    environment: tuple[str, ...]         # %environment assignments


def _existing(path: Path | str, what: str) -> Path:
    path = Path(path)
    if not path.is_file():  # spython would sys.exit on a missing file
        raise CSRunError(f"{what} {path} not found", "give the path of an existing file")
    return path


def read_definition(path: Path | str = DEFINITION) -> Definition:
    """Parse an Apptainer/Singularity definition file (docker bootstrap) with spython."""
    from spython.main.parse.parsers import SingularityParser

    path = _existing(path, "definition file")
    try:
        recipe = next(iter(SingularityParser(str(path)).recipe.values()))
    except NotImplementedError as error:  # spython reads docker bootstraps only
        raise CSRunError(f"{path}: {error}", "use `Bootstrap: docker`") from None
    if not recipe.fromHeader:
        raise CSRunError(f"{path} names no base image", "add a `From:` line after `Bootstrap: docker`")
    files = []
    for line in recipe.files:
        source, _, destination = line.partition(" ")
        files.append((source, destination.strip() or source))
    return Definition(path, recipe.fromHeader, tuple(files), tuple(recipe.install),
                      tuple(recipe.environ))


def missing_sources(definition: Definition, root: Path | str) -> list[str]:
    """The %files sources that do not exist below `root` (where the build runs)."""
    return [source for source, _ in definition.files
            if not os.path.exists(os.path.join(root, source))]


def dockerfile_to_definition(path: Path | str) -> str:
    """The definition-file text spython writes for a Dockerfile.

    A one-stage result loses spython's `Stage: spython-base` line, which spython's own
    parser (and a plain `apptainer build`) does not need and cannot read back.
    """
    from spython.main.parse.parsers import DockerParser
    from spython.main.parse.writers import SingularityWriter

    parser = DockerParser(str(_existing(path, "Dockerfile")))
    lines = SingularityWriter(parser.recipe).convert().splitlines()
    if len(parser.recipe) == 1:
        lines = [line for line in lines if not line.startswith("Stage: ")]
    return "\n".join(lines) + "\n"
