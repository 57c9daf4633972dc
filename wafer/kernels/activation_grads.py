"""The `activation_grad` kernel: an activation's gradient op (TanhGrad, SigmoidGrad,
ReluGrad, LeakyReluGrad, EluGrad, Relu6Grad, SeluGrad, SqrtGrad) computed as a value of the forward
pass, when the loss holds a gradient (tf.gradients(u, x) of a physics-informed network, a
gradient penalty). Its two inputs are the TF op's, in its order; its forward is TF's CPU kernel's arithmetic
(Eigen's scalar_*_gradient_op and the nn_ops functors, float32, the same operation order),
its backward TF's registered gradient of that op (math_grad._TanhGradGrad, ...), so the
weights' training gradient is TF's second-order one."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from wafer.kernels.activations import SELU_ALPHA, SELU_SCALE
from wafer.kernels.base import KernelError, RunContext, register
from wafer.kernels.structure import Elementwise

_ONE, _TWO, _MINUS_TWO = np.float32(1), np.float32(2), np.float32(-2)
_ZERO, _HALF = np.float32(0), np.float32(0.5)

def _inside(x: np.ndarray) -> np.ndarray:
    return ((x > 0) & (x < 6)).astype(np.float32)


def _selu_grad(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(y < 0, dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE)


def _sqrt_grad(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dy == 0, _ZERO, dy * (_HALF / y))


Pair = tuple[np.ndarray, np.ndarray]


def _sqrt_grad_grad(y: np.ndarray, dy: np.ndarray, g: np.ndarray) -> Pair:
    with np.errstate(divide="ignore", invalid="ignore"):
        ga = g / y
        return -ga * _sqrt_grad(y, dy), _HALF * ga
# function -> (forward(a, b, alpha), backward(a, b, alpha, g) -> (ga, gb), FLOPs per element);
# a, b are the TF op's inputs: (y, dy) for tanh and sigmoid, (dy, x or y) for the others
FUNCTIONS: dict[str, tuple[Callable[..., np.ndarray], Callable[..., Pair], int]] = {
    # TanhGrad(y, dy) = dy * (1 - y * y); _TanhGradGrad: (g * -2 * dy * y, TanhGrad(y, g))
    "tanh": (lambda y, dy, a: dy * (_ONE - y * y),
             lambda y, dy, a, g: (((g * _MINUS_TWO) * dy) * y, g * (_ONE - y * y)), 3),
    # SigmoidGrad(y, dy) = dy * (y * (1 - y)) (measured: (dy * y) * (1 - y) differs
    # in the last bit for 32% of values); _SigmoidGradGrad: gb = g * dy,
    # (gb - 2 * gb * y, SigmoidGrad(y, g))
    "sigmoid": (lambda y, dy, a: dy * (y * (_ONE - y)),
                lambda y, dy, a, g: ((g * dy) - (_TWO * (g * dy)) * y, g * (y * (_ONE - y))), 3),
    # ReluGrad(dy, x) = dy * float(x > 0); _ReluGradGrad: (ReluGrad(g, x), zeros)
    "relu": (lambda dy, x, a: dy * (x > 0).astype(np.float32),
             lambda dy, x, a, g: (g * (x > 0).astype(np.float32), np.zeros_like(x)), 1),
    # LeakyReluGrad(dy, x) = x > 0 ? dy : dy * alpha; _LeakyReluGradGrad: (LeakyReluGrad(g, x), 0)
    "leaky_relu": (lambda dy, x, a: np.where(x > 0, dy, dy * a),
                   lambda dy, x, a, g: (np.where(x > 0, g, g * a), np.zeros_like(x)), 2),
    # Relu6Grad(dy, x) = dy * float(0 < x < 6); _Relu6GradGrad: (Relu6Grad(g, x), zeros)
    "relu6": (lambda dy, x, a: dy * _inside(x),
              lambda dy, x, a, g: (g * _inside(x), np.zeros_like(x)), 2),
    # SeluGrad(dy, y) = y < 0 ? dy * (y + scale * alpha) : dy * scale; _SeluGradGrad:
    # (SeluGrad(g, y), where(y < 0, g * dy, 0))
    "selu": (lambda dy, y, a: _selu_grad(dy, y),
             lambda dy, y, a, g: (_selu_grad(g, y), np.where(y < 0, g * dy, _ZERO)), 3),
    # EluGrad(dy, y) = y < 0 ? dy * (y + 1) : dy; _EluGradGrad: (EluGrad(g, y),
    # where(y < 0, g * dy, 0))
    "elu": (lambda dy, y, a: np.where(y < 0, dy * (y + _ONE), dy),
            lambda dy, y, a, g: (np.where(y < 0, g * (y + _ONE), g),
                                 np.where(y < 0, g * dy, _ZERO)), 3),
    # SqrtGrad(y, dy) = dy * (0.5 / y), 0 where dy is 0 (measured: (0.5 * dy) / y differs in
    # the last bit for 25% of values);
    # _SqrtGradGrad: ga = g / y, (-ga * SqrtGrad(y, dy), 0.5 * ga)
    "sqrt": (lambda y, dy, a: _sqrt_grad(y, dy), lambda y, dy, a, g: _sqrt_grad_grad(y, dy, g), 2),
}
# TF op -> the kernel's function
OPS = {"TanhGrad": "tanh", "SigmoidGrad": "sigmoid", "ReluGrad": "relu",
       "LeakyReluGrad": "leaky_relu", "EluGrad": "elu", "Relu6Grad": "relu6", "SeluGrad": "selu",
       "SqrtGrad": "sqrt"}


@register
class ActivationGrad(Elementwise):
    """attr function (FUNCTIONS), alpha (leaky_relu); two inputs of one shape, the TF op's."""

    type_name = "activation_grad"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.function = str(self.attrs.get("function"))
        if self.function not in FUNCTIONS or len(self.input_shapes) != 2 or \
                self.input_shapes[0] != self.input_shapes[1]:
            raise KernelError(f"kernel {name!r} (activation_grad): takes 2 inputs of one shape "
                              f"and a function among {', '.join(FUNCTIONS)}, got "
                              f"{self.function!r} on {self.input_shapes}")
        self.alpha = np.float32(self.attrs.get("alpha", 0.2))

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def flops_per_sample(self) -> float:
        return float(FUNCTIONS[self.function][2] * self._elements())

    def activation_bytes_per_sample(self) -> int:
        return 8 * self._elements()  # both inputs

    def forward(self, params, inputs, ctx: RunContext):
        a, b = inputs
        return FUNCTIONS[self.function][0](a, b, self.alpha).astype(np.float32, copy=False), (a, b)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        a, b = cache
        ga, gb = FUNCTIONS[self.function][1](a, b, self.alpha, grad_output)
        return [ga.astype(np.float32, copy=False), gb.astype(np.float32, copy=False)], {}
