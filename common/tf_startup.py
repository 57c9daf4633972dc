"""TensorFlow's start-up chatter, kept off the user's terminal.

On some CPUs (AVX-512: oneDNN on by default) importing TensorFlow prints absl INFO lines
before absl's logging is initialised ("oneDNN custom operations are on …", "All log messages
before absl::InitializeLog() …"); `TF_CPP_MIN_LOG_LEVEL` does not reach them. `install()`
puts a finder on `sys.meta_path` that runs TensorFlow's first import with file descriptor 2
redirected to a temporary file, then writes back every line but that chatter, and sets
`TF_CPP_MIN_LOG_LEVEL=2` for the rest of TensorFlow's logging when the user has not set it.

It is installed at interpreter start-up by `csrun-tf-startup.pth` (written into the
environment's site-packages by `python -m common.tf_startup`, which `make venv` and the image
recipe run), so a script whose first line is `import tensorflow` is covered too, and again
by csrun's user API on import. `--debug` on the command line, or `TF_CPP_MIN_LOG_LEVEL=0`,
leaves TensorFlow's output as it is. Task logs keep what a task prints; the launcher filters
the terminal copy with the same pattern (`CHATTER`).
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Iterator, Sequence

CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} \d\d:\d\d:[\d.]+ +\d+ \S+\.cc:\d+\] )")
LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
PTH_NAME = "csrun-tf-startup.pth"
# Run at every start of the environment's Python: installs the finder, then forgets the
# `common` package again (a user's own `common` stays importable); an uninstalled csrun is
# no error.
PTH_LINE = ('import sys; exec("try:\\n import common.tf_startup as m\\n m.install()\\n'
            ' for n in (\'common.tf_startup\', \'common\'): sys.modules.pop(n, None)\\n'
            'except ImportError:\\n pass")\n')


def wanted(argv: Sequence[str] | None = None) -> bool:
    """Should TensorFlow's start-up chatter be kept off the terminal? Not under `--debug`
    (or CSRUN_DEBUG=1), nor when the user asked TensorFlow for everything (level 0)."""
    argv = sys.argv if argv is None else argv
    debug = "--debug" in argv or os.environ.get("CSRUN_DEBUG") == "1"
    return not debug and os.environ.get(LOG_LEVEL_ENV) != "0"


def without_chatter(text: str) -> str:
    """`text` without TensorFlow's start-up lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not CHATTER.match(line))


@contextlib.contextmanager
def stderr_without_chatter() -> Iterator[None]:
    """Run the body with fd 2 captured; afterwards write back all of it but the chatter."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to keep clean
        yield
        return
    import tempfile

    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = without_chatter(capture.read().decode(errors="replace"))
            if kept:
                os.write(2, kept.encode())


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with its chatter held back."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        os.environ.setdefault(LOG_LEVEL_ENV, "2")
        with stderr_without_chatter():
            self.loader.exec_module(module)


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands TensorFlow's first import to `_QuietLoader`, once."""

    csrun_tf_startup = True  # recognised across copies of this module (see PTH_LINE)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        uninstall()
        if not wanted():
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


def install() -> None:
    """Keep the chatter of TensorFlow's first import in this process off the terminal (a
    no-op once TensorFlow is imported, or when installed already)."""
    if "tensorflow" in sys.modules or any(getattr(f, "csrun_tf_startup", False) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TensorFlowFinder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "csrun_tf_startup", False)]


def install_pth(site_packages: str | None = None) -> str:
    """Write `PTH_NAME` into `site_packages` (default: this interpreter's): `install()` at
    every start of this environment's Python. Returns its path."""
    import sysconfig

    path = os.path.join(site_packages or sysconfig.get_paths()["purelib"], PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    print(install_pth())
