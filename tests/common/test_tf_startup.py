"""TensorFlow's start-up chatter stays off the terminal whatever the CPU (issue 27).

These runs set TF_ENABLE_ONEDNN_OPTS=1 (the rest of the suite pins it to 0: tests/conftest.py):
TensorFlow then prints its oneDNN lines on import on any x86 CPU, as it does by default on
CPUs with AVX-512."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from functools import partial
from pathlib import Path

from processes import together

from common import tf_startup

ROOT = Path(__file__).resolve().parents[2]
IMPORT_TF = "import tensorflow, sys; print('imported', file=sys.stderr)"


def _python(args: list[str], cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CSRUN_DEBUG")}
    environ.update(TF_ENABLE_ONEDNN_OPTS="1", **env)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=300)


def test_the_install_step_put_the_startup_hook_into_this_environment():
    pth = Path(sysconfig.get_paths()["purelib"]) / tf_startup.PTH_NAME
    assert pth.read_text() == tf_startup.PTH_LINE


def test_a_script_importing_tensorflow_first_shows_no_startup_lines_but_debug_does():
    quiet, loud, asked = together(partial(_python, ["-c", IMPORT_TF]),
                                  partial(_python, ["-c", IMPORT_TF, "--debug"]),
                                  partial(_python, ["-c", IMPORT_TF], TF_CPP_MIN_LOG_LEVEL="0"))
    assert quiet.stderr == "imported\n"
    assert "oneDNN custom operations are on" in loud.stderr  # the condition is real: TF prints them here
    assert "oneDNN custom operations are on" in asked.stderr


def test_a_users_run_py_that_imports_tensorflow_first_fails_with_one_line(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""\
        import tensorflow as tf
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from launcher.run_utils import get_params
        get_params("nope.yaml")
        """))
    proc = _python([str(script)], cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "run.py: error: params file nope.yaml not found (hint: give an existing YAML file with -p/--params)"]


def test_only_the_chatter_is_held_back_and_the_rest_comes_through_in_order(capfd):
    lines = ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
             "I0000 00:00:1795557107.137218    2274 port.cc:153] oneDNN custom operations are on.\n",
             "W0000 00:00:1795557107.137218    2274 port.cc:9] a warning stays\n",
             "a line of the user's\n"]
    with tf_startup.stderr_without_chatter():
        for line in lines:
            os.write(2, line.encode())
    assert capfd.readouterr().err == lines[2] + lines[3]
