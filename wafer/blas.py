"""numpy's own BLAS for compiled code: the `cblas_sgemm` of the OpenBLAS numpy is built with
(and loads), bound by name for numba (`SGEMM`), so that a compiled tile calls exactly the
GEMM numpy's matmul calls, with the same arguments, and sums in the same order.

numpy's matmul of two float32 matrices (no dimension 1) whose rows or columns are
contiguous calls `cblas_sgemm(RowMajor, ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)` with
`ta` NoTrans when a's rows are contiguous (lda: its row stride in elements), else Trans
(lda: its column stride); `tb` alike; ldc the output's row stride.
The thread count is the library's own (`wse_sim.stages.one_blas_thread` sets it to one).
"""
from __future__ import annotations

import ctypes
import os

import llvmlite.binding
import numpy as np
import threadpoolctl
from numba import types

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
# numpy's OpenBLAS (scipy-openblas, 64-bit integers): its symbols' prefix and suffix
_NAMES = ("scipy_cblas_sgemm64_", "cblas_sgemm64_", "cblas_sgemm")


def _numpy_library() -> tuple[str, str]:
    """The path of the BLAS numpy loaded and its sgemm's symbol name."""
    numpy_root = os.path.dirname(os.path.dirname(os.path.realpath(np.__file__)))
    for lib in threadpoolctl.threadpool_info():  # (the venv may be reached through a symlink)
        if lib["user_api"] == "blas" and os.path.realpath(lib["filepath"]).startswith(numpy_root) and \
                os.path.basename(os.path.dirname(lib["filepath"])).startswith("numpy"):
            handle = ctypes.CDLL(lib["filepath"])
            for name in _NAMES:
                if hasattr(handle, name):
                    return lib["filepath"], name
    raise ImportError("numpy's BLAS (cblas_sgemm) was not found among the loaded libraries")


def _bind() -> types.ExternalFunction:
    path, name = _numpy_library()
    address = ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value
    llvmlite.binding.add_symbol("csrun_sgemm", address)  # one name, whatever the library's
    blasint = types.int64 if name.endswith("64_") else types.int32
    return types.ExternalFunction("csrun_sgemm", types.void(
        types.int32, types.int32, types.int32, blasint, blasint, blasint, types.float32,
        types.intp, blasint, types.intp, blasint, types.float32, types.intp, blasint))


SGEMM = _bind()

