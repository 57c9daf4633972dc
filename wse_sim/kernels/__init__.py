"""The kernel library. Importing this package registers every kernel in KERNELS.

Catalog (the contract between the compiler, which emits these, and the simulator, which
runs them). Shapes are per sample; `activation` attrs take the names of the `activation`
kernel's functions.

| type | inputs | attrs | params (role: shape) |
|---|---|---|---|
| dense | x (..., n) | units, use_bias, activation | kernel: (n, units), bias: (units,) |
| conv2d | x (H, W, C) NHWC | filters, kernel_size [kh, kw], strides [sh, sw], padding SAME/VALID, use_bias, activation | kernel: (kh, kw, C, filters), bias: (filters,) |
| max_pool, avg_pool | x (H, W, C) | pool_size [ph, pw], strides [sh, sw], padding | — |
| activation | x | function: relu, relu6, leaky_relu, elu, selu, tanh, sigmoid, softplus, linear; alpha (leaky_relu) | — |
| dropout | x | rate | — |
| reshape | x | shape [per-sample target shape] (flatten = reshape to [n]) | — |
| add | x1, x2, ... same shape | — | — |
| concat | x1, x2, ... | axis (per-sample axis, >= 0) | — |
| sparse_softmax_cross_entropy | logits (k,), labels () int | reduction: mean or sum | — |
| softmax_cross_entropy | logits (k,), labels (k,) | reduction | — |
| sigmoid_cross_entropy | logits (...), labels (...) | reduction | — |
| mean_squared_error | predictions (...), labels (...) | reduction | — |

Losses (`is_loss = True`) output one value per sample, already scaled so that the sum
over the whole batch is the loss: "mean" divides by the number of loss elements in the
batch (batch size x per-sample elements), "sum" does not. Their backward takes no
upstream gradient and returns the gradient of that scaled value, so micro-batches add up
to ordinary mini-batch training.
"""
from wse_sim.kernels import activations, conv, dense, einsum, losses, structure  # noqa: F401 (register)
from wse_sim.kernels.base import KERNELS, Kernel, KernelError, RunContext, build_kernel, register

__all__ = ["KERNELS", "Kernel", "KernelError", "RunContext", "build_kernel", "register"]
