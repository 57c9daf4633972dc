"""Mixed precision in the user's graph: which kernels compute in float16, which float
dtypes the CS refuses, and the csconfig keys of the original's 16-bit formats.

A kernel computing a float16 tensor of the graph (a Keras `mixed_float16` layer, or casts
written by hand) carries attr `precision` "float16"; `wafer.precision` says what the CS
then rounds where. Weights stay float32 variables, read through TF's cast to float16.
"""
from __future__ import annotations

import tensorflow as tf

from common.errors import CSRunError
from wafer.precision import FLOAT16

# float dtypes an op of the forward graph may compute in
COMPUTED = ("float32", FLOAT16)


def dtype_problem(dtype: str) -> str:
    """Why the CS refuses an op computing in `dtype` ("" if it does not)."""
    if dtype == "bfloat16":
        return ("computes in bfloat16: the CS computes 16-bit floats as IEEE float16 "
                "(float32 accumulation); use the mixed_float16 policy")
    if dtype.startswith("complex"):
        return (f"computes in {dtype} (complex values): the CS computes complex64 values of a "
                "sample (FFTs along its own axes, complex arithmetic) read through their real "
                "and imaginary parts or magnitude; compute in complex64, or in input_fn")
    return (f"computes in {dtype}: the CS computes in float32 or float16 (integers and "
            "booleans for indices and masks); compute in float32 or float16")


def tensor_precision(tensor: tf.Tensor | None) -> str:
    """"float16" for a float16 tensor, else "" (the kernel computes in float32)."""
    return FLOAT16 if tensor is not None and tensor.dtype.base_dtype == tf.float16 else ""


def check_config(params: dict) -> None:
    """csconfig.use_cbfloat16 (the CS-1's 16-bit format with 6 exponent bits) is refused:
    the simulated CS computes float16 exactly as TensorFlow's CPU does, not cbfloat16."""
    csconfig = params.get("csconfig") or {}
    if isinstance(csconfig, dict) and csconfig.get("use_cbfloat16"):
        raise CSRunError("csconfig.use_cbfloat16 is True: the simulated CS computes 16-bit "
                         "floats as IEEE float16 only (cbfloat16 has no TensorFlow CPU "
                         "reference to train against)",
                         "set csconfig.use_cbfloat16 to False (mixed_float16 trains in float16)")
