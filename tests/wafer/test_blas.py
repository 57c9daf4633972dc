"""wafer.blas finds the OpenBLAS numpy loaded when the venv is reached through a symlink (a
checkout linked elsewhere): threadpoolctl names the library by its resolved path, numpy's
own path is the symlinked one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_numpys_blas_is_found_through_a_symlinked_venv(tmp_path):
    venv = tmp_path / "venv"
    venv.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    python = venv / Path(sys.executable).relative_to(sys.prefix)
    done = subprocess.run(
        [str(python), "-c", "import numpy, wafer.blas; print(numpy.__file__); "
         "print(wafer.blas._numpy_library()[0])"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    numpy_file, library = done.stdout.split()
    assert numpy_file.startswith(str(venv))  # (numpy imported through the link)
    assert os.path.realpath(library).startswith(os.path.realpath(sys.prefix))
