"""Element-wise activation functions, forward and backward side by side, and the
`activation` kernel. Dense and conv2d kernels fuse the same functions.

Each function's backward reads what TensorFlow's gradient op reads (the input x or the
output y), so the arithmetic follows TF's (e.g. EluGrad and SeluGrad use the output).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from wse_sim.kernels.base import Kernel, KernelError, RunContext, max_cores_for, register

SELU_SCALE = np.float32(1.0507009873554804934193349852946)
SELU_ALPHA = np.float32(1.6732632423543772848170429916717)
_ONE = np.float32(1.0)


def _relu(x, alpha, out):
    return np.maximum(x, 0, out=out)


def _relu_grad(x, y, alpha, dy, out):
    return np.multiply(dy, y > 0, out=out)


def _relu6(x, alpha, out):
    return np.clip(x, 0, 6, out=out)


def _relu6_grad(x, y, alpha, dy, out):
    return np.multiply(dy, (x > 0) & (x < 6), out=out)


def _leaky(x, alpha, out):
    return _store(np.where(x > 0, x, x * np.float32(alpha)), out)


def _leaky_grad(x, y, alpha, dy, out):
    return _store(np.where(x > 0, dy, dy * np.float32(alpha)), out)


def _elu(x, alpha, out):
    return _store(np.where(x > 0, x, np.expm1(np.minimum(x, 0))), out)


def _elu_grad(x, y, alpha, dy, out):
    return _store(np.where(y < 0, (y + _ONE) * dy, dy), out)


def _selu(x, alpha, out):
    return _store(np.where(x > 0, SELU_SCALE * x, SELU_SCALE * SELU_ALPHA * np.expm1(np.minimum(x, 0))), out)


def _selu_grad(x, y, alpha, dy, out):
    return _store(np.where(y < 0, dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE), out)


def _tanh(x, alpha, out):
    return np.tanh(x, out=out)


def _tanh_grad(x, y, alpha, dy, out):
    return _store(dy * (_ONE - y * y), out)


def _sigmoid(x, alpha, out):
    return _store(sigmoid(x), out)


def _sigmoid_grad(x, y, alpha, dy, out):
    return _store(dy * y * (_ONE - y), out)


def _softplus(x, alpha, out):
    return np.logaddexp(np.float32(0), x, out=out)


def _softplus_grad(x, y, alpha, dy, out):
    return _store(dy * sigmoid(x), out)


def _linear(x, alpha, out):
    if out is None:
        return x
    np.copyto(out, x)
    return out


def _linear_grad(x, y, alpha, dy, out):
    return _linear(dy, alpha, out)


def _store(value: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    value = value.astype(np.float32, copy=False)
    if out is None:
        return value
    np.copyto(out, value)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float32."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, _ONE / (_ONE + e), e / (_ONE + e)).astype(np.float32, copy=False)


Forward = Callable[[np.ndarray, float, "np.ndarray | None"], np.ndarray]
Backward = Callable[[np.ndarray, np.ndarray, float, np.ndarray, "np.ndarray | None"], np.ndarray]

# name -> (forward(x, alpha, out), backward(x, y, alpha, dy, out), FLOPs per element)
FUNCTIONS: dict[str, tuple[Forward, Backward, int]] = {
    "relu": (_relu, _relu_grad, 1),
    "relu6": (_relu6, _relu6_grad, 2),
    "leaky_relu": (_leaky, _leaky_grad, 2),
    "elu": (_elu, _elu_grad, 4),
    "selu": (_selu, _selu_grad, 5),
    "tanh": (_tanh, _tanh_grad, 4),
    "sigmoid": (_sigmoid, _sigmoid_grad, 4),
    "softplus": (_softplus, _softplus_grad, 4),
    "linear": (_linear, _linear_grad, 0),
}


def check_function(kernel: str, name: Any) -> str:
    if name not in FUNCTIONS:
        raise KernelError(f"kernel {kernel!r}: unknown activation {name!r}; "
                          f"the library has {', '.join(FUNCTIONS)}")
    return str(name)


def apply(name: str, x: np.ndarray, alpha: float = 0.2, out: np.ndarray | None = None) -> np.ndarray:
    return FUNCTIONS[name][0](x, alpha, out)


def gradient(name: str, x: np.ndarray, y: np.ndarray, dy: np.ndarray, alpha: float = 0.2,
             out: np.ndarray | None = None) -> np.ndarray:
    """dL/dx from dL/dy, given the function's input x and output y."""
    return FUNCTIONS[name][1](x, y, alpha, dy, out)


@register
class Activation(Kernel):
    """An element-wise function of one input (leaky_relu carries its `alpha`)."""

    type_name = "activation"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: activation takes 1 input, got {len(self.input_shapes)}")
        self.function = check_function(name, self.attrs.get("function"))
        self.alpha = float(self.attrs.get("alpha", 0.2))

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def _elements(self) -> int:
        return int(np.prod(self.input_shapes[0], dtype=np.int64))

    def flops_per_sample(self) -> float:
        return float(max(FUNCTIONS[self.function][2], 1) * self._elements())

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * self._elements()  # input and output

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        y = apply(self.function, x, self.alpha)
        return y, (x, y)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, y = cache
        return [gradient(self.function, x, y, grad_output, self.alpha)], {}
