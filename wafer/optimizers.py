"""Optimizers with the exact `tf.compat.v1.train` update rules, applied in place, float32,
in the operation order of TensorFlow's CPU kernels (tensorflow/core/kernels/training_ops.cc).

Dense rules (`Apply*` kernels; every product and sum rounded to float32 in this order):

    sgd       var -= g * lr                                          (ApplyGradientDescent)
    momentum  accum = accum * mu + g                                  (ApplyMomentum)
              var -= accum * lr;  nesterov: var -= g * lr + accum * mu * lr
    adam      alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)  (ApplyAdam)
              m += (g - m) * (1 - beta1); v += (g * g - v) * (1 - beta2)
              var -= m * alpha / (sqrt(v) + epsilon)
              after every variable of the step: beta1_power *= beta1, beta2_power *= beta2
    rmsprop   ms += (g * g - ms) * (1 - decay)                        (ApplyRMSProp)
              mom = mom * momentum + g * lr / sqrt(ms + epsilon); var -= mom
              centered: mg += (g - mg) * (1 - decay)                   (ApplyCenteredRMSProp)
              mom = mom * momentum + g * lr / sqrt(ms - mg * mg + epsilon); var -= mom
    adagrad   accum += g * g; var -= g * lr * rsqrt(accum)            (ApplyAdagrad)
    adamw     m = beta1 * m + (1 - beta1) * g                        (the modelzoo's
              v = beta2 * v + (1 - beta2) * (g * g)                    AdamWOptimizer, its
              u = m / (sqrt(v) + epsilon)                              ops in TF's graph;
              bias correction: u *= sqrt(1 - beta2_power) / (1 - beta1_power)
              u += weight_decay_rate * var (variables not excluded); var -= lr * u
              (not decayed, corrected: Grappler, on by default, reassociates
              lr * (u * correction) as (correction * lr) * u: measured)
              (1 - beta as the graph holds it: the modelzoo computes it in float64)
    adadelta  accum = accum * rho + g * g * (1 - rho)                 (ApplyAdadelta)
              update = sqrt(accum_update + epsilon) * rsqrt(accum + epsilon) * g
              var -= update * lr; accum_update = accum_update * rho + update * update * (1 - rho)
    ftrl      new = accum + g * g; gs = g [+ 2 * l2_shrinkage * var]   (ApplyFtrl, ApplyFtrlV2;
              linear += gs - (sqrt(new) - sqrt(accum)) / lr * var        lr_power -0.5 only)
              var = |linear| > l1 ? (l1 * sign(linear) - linear) / (sqrt(new) / lr + 2 * l2) : 0
              accum = new
    proximal_adagrad  accum += g * g; a = lr * rsqrt(accum)         (ApplyProximalAdagrad)
              var -= g * a; l1 > 0: var = sign(var) * max(|var| - a * l1, 0) / (1 + l2 * a)
              else var = var / (1 + l2 * a)
    proximal_sgd  var -= g * lr                                 (ApplyProximalGradientDescent)
              l1 > 0: var = sign(var) * max(|var| - lr * l1, 0) / (1 + l2 * lr)
              else var = var / (1 + l2 * lr)

Sparse rules (Param.update "sparse": the gradient of an embedding lookup, TF's
IndexedSlices of one row per looked-up id, ids in batch order). SGD scatter-adds
-g * lr row by row, duplicates included (ResourceScatterAdd). The others first sum the
rows of duplicate ids in order of appearance (Optimizer._deduplicate_indexed_slices), then:

    momentum  rows only: accum = accum * mu + g; var -= lr * accum
              nesterov: var -= lr * g + lr * mu * accum               (SparseApplyMomentum)
    adagrad   rows only: accum += g * g; var -= lr * g * rsqrt(accum)  (SparseApplyAdagrad;
              a table of one column: var -= lr * g / sqrt(accum))
    rmsprop   rows only: ms = ms * decay + g * g * (1 - decay)          (SparseApplyRMSProp)
              mom = mom * momentum + rsqrt(ms + epsilon) * lr * g; var -= mom
              centered: mg = mg * decay + g * (1 - decay)              (SparseApplyCenteredRMSProp)
              mom = mom * momentum + rsqrt(ms + epsilon - mg * mg) * lr * g; var -= mom
    adamw     the deduplicated rows as a dense gradient, the dense rule (the modelzoo's
              sparse update converts the IndexedSlices to a tensor)
    adadelta  rows only: the dense rule                               (SparseApplyAdadelta)
    proximal_sgd  rows only: the dense rule; a table of one column divides in float64
              (SparseApplyProximalGradientDescent's scalar path: 1.0 + l2 * lr is a double)
    proximal_adagrad  rows only: the dense rule (SparseApplyProximalAdagrad); a table of one
              column: a = lr / sqrt(accum), the quotient in float64 as proximal_sgd's
    ftrl      rows only: the dense rule, var = (clip(linear, -l1, l1) - linear) / y (SparseApplyFtrl;
              equal to the dense select; a table of one column takes TF's scalar path:
              linear = (linear + g) - (powf(new, 0.5) - powf(accum, 0.5)) / lr * var, with
              glibc's powf, which the CS calls too: wafer/libm.py)
    adam      every row: m = m * beta1; m[rows] += g * (1 - beta1)   (_apply_sparse_shared)
              v = v * beta2; v[rows] += g * (g * (1 - beta2))
              var -= alpha * m / (sqrt(v) + epsilon)
              (TF's graph writes (g * g) * (1 - beta2); Grappler, on in every session by
              default, reassociates it as here: measured with ids fed at run time)

Exactness. SGD, momentum (plain and Nesterov), Adam and RMSProp's dense rules, and the sparse
SGD, momentum and Adam rules, are bit-equal to TensorFlow 2.21 on CPU. TF's `rsqrt` is Eigen's
fast approximation (the CPU's reciprocal-square-root estimate refined by one Newton step:
its value depends on the processor), which numpy cannot reproduce: the CS computes 1 / sqrt,
correctly rounded twice. Affected are dense Adagrad, Adadelta and ProximalAdagrad (dense and
sparse), and the sparse Adagrad and RMSProp rules
(on the columns of a table that fill Eigen's 8-float packets: a table of one column, and the
last 4 of 12 columns, take TF's exact scalar path): tests/wafer/test_wse_optimizers.py measures
2-4 float32 ULP of difference in one step's update (bound asserted: 6). FTRL with an lr_power
other than -0.5 is refused: TF raises the accumulator to -lr_power with Eigen's pow, 1 ULP
from the C library's powf in a quarter of the values (measured), and FTRL's difference of two
powers and its shrinkage toward zero magnify that to 1% of a weight.

Slots are named as TensorFlow's tf.compat.v1 optimizers name them ("<var>/<suffix>" with the
suffixes below, in order) and start as TF starts them; Adam's step counters are the scalars
"beta1_power" and "beta2_power". Everyone else reads the names from here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from cs_api import cs_api_pb2 as pb
from wafer.libm import powf
from wafer.precision import round_half_, round_half_into

F32 = np.float32
_NO_HALF = np.zeros(0, F32)  # (SGD.apply_fused without float16 operands)


@dataclass(frozen=True)
class OptimizerConfig:
    """A tf.compat.v1.train optimizer's type and hyper-parameters: what the compiler proves
    from the graph, the program carries (`to_message`, `from_message`) and the CS applies.
    A hyper-parameter the optimizer does not read is 0, as a field the message leaves out."""

    type: str  # sgd, momentum, adam, rmsprop, adagrad, adamw, adadelta, ftrl, proximal_adagrad, proximal_sgd
    learning_rate: float
    momentum: float = 0.0  # momentum, rmsprop
    use_nesterov: bool = False  # momentum
    beta1: float = 0.0  # adam
    beta2: float = 0.0  # adam
    epsilon: float = 0.0  # adam, rmsprop, adadelta
    decay: float = 0.0  # rmsprop, adadelta (its rho)
    centered: bool = False  # rmsprop
    initial_accumulator_value: float = 0.0  # adagrad, ftrl, proximal_adagrad
    weight_decay_rate: float = 0.0  # adamw
    use_bias_correction: bool = False  # adamw
    no_weight_decay: tuple[str, ...] = ()  # adamw: the variables it does not decay
    one_minus_beta1: float = 0.0  # adamw: 1 - beta1 as the graph holds it (the modelzoo
    one_minus_beta2: float = 0.0  # computes it from Python floats, in float64)
    l1: float = 0.0  # ftrl, proximal_adagrad, proximal_sgd: regularization strengths
    l2: float = 0.0
    l2_shrinkage: float = 0.0  # ftrl
    lr_power: float = 0.0  # ftrl
    # adam: its step counters' TF names when not beta1_power, beta2_power (a second
    # AdamOptimizer of the graph keeps beta1_power_1, beta2_power_1)
    scalar_names: tuple[str, ...] = ()

    @classmethod
    def from_message(cls, message: pb.Optimizer) -> "OptimizerConfig":
        values = {f.name: getattr(message, f.name) for f in fields(cls)}
        return cls(**{**values, "no_weight_decay": tuple(values["no_weight_decay"]),
                      "scalar_names": tuple(values["scalar_names"])})

    def to_message(self) -> pb.Optimizer:
        return pb.Optimizer(**asdict(self))


def slot_name(variable: str, suffix: str) -> str:
    """A slot variable's TF name."""
    return f"{variable}/{suffix}"


def _deduplicate(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TF's unique + unsorted_segment_sum: each id once, its rows summed in batch order."""
    rows, position = np.unique(indices, return_inverse=True)
    summed = np.zeros((len(rows),) + values.shape[1:], F32)
    np.add.at(summed, position.reshape(-1), values)
    return rows, summed


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.divide(F32(1), np.sqrt(x))


class Optimizer:
    """Updates one variable at a time in place; `finish_step` runs once per step after all."""

    scalar_names: tuple[str, ...] = ()  # (AdamW keeps them only with bias correction)

    def __init__(self, config: OptimizerConfig):
        self.config = config
        self.lr = F32(config.learning_rate)
        self.scalars: dict[str, np.ndarray] = {}
        self.slot_suffixes: tuple[str, ...] = ()
        self.slot_initial_values: tuple[float, ...] = ()  # by slot, as TF initialises them

    def initial_scalars(self) -> dict[str, np.ndarray]:
        return {}

    def load_scalars(self, state: Mapping[str, np.ndarray]) -> None:
        """Take the scalars `state` holds (a checkpoint's, a snapshot's)."""
        for name in self.scalar_names:
            if name in state:
                self.scalars[name] = np.asarray(state[name], F32)

    def set_hyper_parameters(self, values: dict[str, np.float32]) -> None:
        """This step's values of scheduled hyper-parameters (wafer.schedules): the optimizer
        is as if configured with them; its slots and scalars stay."""
        scalars = self.scalars
        changed: dict = {k: float(v) for k, v in values.items()}
        type(self).__init__(self, replace(self.config, **changed))
        self.scalars = scalars

    def apply(self, var: np.ndarray, grad: np.ndarray, slots: list[np.ndarray],
              scratch: list[np.ndarray]) -> None:
        """var -= update(grad); `slots` in slot_suffixes order; two scratch arrays shaped
        like var."""
        raise NotImplementedError

    def apply_fused(self, var: np.ndarray, grad: np.ndarray, slots: list[np.ndarray],
                    scratch: list[np.ndarray], half: np.ndarray | None,
                    round_gradient: bool) -> None:
        """`apply` with a float16 layer's roundings around it: the gradient rounded to
        float16 first when `round_gradient` (grad may be left rounded or not), and the new
        var rounded into `half` when given (its operands for the next batch)."""
        if round_gradient:
            round_half_(grad)
        self.apply(var, grad, slots, scratch)
        if half is not None:
            round_half_into(var, half)

    def apply_sparse(self, var: np.ndarray, indices: np.ndarray, values: np.ndarray,
                     slots: list[np.ndarray]) -> None:
        """The update for an IndexedSlices gradient: `values[k]` is the gradient of row
        `indices[k]` of var (ids may repeat, in batch order)."""
        raise NotImplementedError

    def finish_step(self) -> None:
        """After every variable of the step was updated."""

    def for_variable(self, name: str) -> "Optimizer":
        """The rule that updates variable `name` (AdamW: without weight decay for some)."""
        return self

    def member(self, index: int) -> "Optimizer":
        """The optimizer whose hyper-parameters a schedule of `index` sets (Schedule.optimizer:
        0 the program's, k its optimizer group k - 1's)."""
        return self


class SGD(Optimizer):
    def apply(self, var, grad, slots, scratch):
        s = scratch[0]
        np.multiply(grad, self.lr, out=s)
        np.subtract(var, s, out=var)

    def apply_fused(self, var, grad, slots, scratch, half, round_gradient):
        """One compiled pass on contiguous arrays (`wafer.compiled.sgd_update`: no GIL,
        the same float32 operations as `apply`)."""
        if not (var.flags.c_contiguous and grad.flags.c_contiguous
                and (half is None or half.flags.c_contiguous)):
            super().apply_fused(var, grad, slots, scratch, half, round_gradient)
            return
        from wafer import compiled  # (numba: the simulator's alone)

        compiled.sgd_update(var.reshape(-1), grad.reshape(-1), self.lr,
                            _NO_HALF if half is None else half.reshape(-1), round_gradient,
                            half is not None)

    def apply_sparse(self, var, indices, values, slots):
        np.add.at(var, indices, np.negative(values) * self.lr)


class Momentum(Optimizer):

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.mu = F32(config.momentum)
        self.slot_suffixes, self.slot_initial_values = ("Momentum",), (0.0,)

    def apply(self, var, grad, slots, scratch):
        (accum,), (s, t) = slots, scratch
        np.multiply(accum, self.mu, out=accum)
        np.add(accum, grad, out=accum)
        if self.config.use_nesterov:  # var -= g * lr + accum * mu * lr
            np.multiply(grad, self.lr, out=s)
            np.multiply(accum, self.mu, out=t)
            np.multiply(t, self.lr, out=t)
            np.add(s, t, out=s)
        else:
            np.multiply(accum, self.lr, out=s)
        np.subtract(var, s, out=var)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        (accum,) = slots
        a = accum[rows] * self.mu + g
        accum[rows] = a
        if self.config.use_nesterov:
            var[rows] -= self.lr * g + (self.lr * self.mu) * a
        else:
            var[rows] -= self.lr * a


class Adam(Optimizer):
    scalar_names: tuple[str, ...] = ("beta1_power", "beta2_power")

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.beta1, self.beta2, self.eps = F32(config.beta1), F32(config.beta2), F32(config.epsilon)
        self.one_minus_beta1, self.one_minus_beta2 = F32(1) - self.beta1, F32(1) - self.beta2
        self.slot_suffixes, self.slot_initial_values = ("Adam", "Adam_1"), (0.0, 0.0)
        self.scalar_names = config.scalar_names or Adam.scalar_names

    def initial_scalars(self):
        return {self.scalar_names[0]: np.asarray(self.beta1, F32),
                self.scalar_names[1]: np.asarray(self.beta2, F32)}

    def alpha(self) -> np.float32:
        b1, b2 = (F32(self.scalars[name]) for name in self.scalar_names)
        return F32(self.lr * np.sqrt(F32(1) - b2) / (F32(1) - b1))

    def apply(self, var, grad, slots, scratch):
        (m, v), (s, t) = slots, scratch
        alpha = self.alpha()
        np.subtract(grad, m, out=s)  # m += (g - m) * (1 - beta1)
        np.multiply(s, self.one_minus_beta1, out=s)
        np.add(m, s, out=m)
        np.multiply(grad, grad, out=s)  # v += (g * g - v) * (1 - beta2)
        np.subtract(s, v, out=s)
        np.multiply(s, self.one_minus_beta2, out=s)
        np.add(v, s, out=v)
        np.multiply(m, alpha, out=s)  # var -= m * alpha / (sqrt(v) + epsilon)
        np.sqrt(v, out=t)
        np.add(t, self.eps, out=t)
        np.divide(s, t, out=s)
        np.subtract(var, s, out=var)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        m, v = slots
        alpha = self.alpha()
        np.multiply(m, self.beta1, out=m)
        m[rows] += g * self.one_minus_beta1
        np.multiply(v, self.beta2, out=v)
        v[rows] += g * (g * self.one_minus_beta2)  # TF's (g * g) * (1 - beta2), reassociated
        var -= alpha * m / (np.sqrt(v) + self.eps)

    def finish_step(self):
        for name, beta in zip(self.scalar_names, (self.beta1, self.beta2)):
            self.scalars[name] = np.asarray(F32(self.scalars[name]) * beta, F32)


class RMSProp(Optimizer):
    """Slots: RMSProp (the mean square, starts at one), then centered RMSProp_1 (the mean
    gradient), then the momentum accumulator (RMSProp_1, or RMSProp_2 when centered)."""


    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.rho, self.mu, self.eps = F32(config.decay), F32(config.momentum), F32(config.epsilon)
        self.one_minus_rho = F32(1) - self.rho
        if config.centered:
            self.slot_suffixes = ("RMSProp", "RMSProp_1", "RMSProp_2")
            self.slot_initial_values = (1.0, 0.0, 0.0)
        else:
            self.slot_suffixes, self.slot_initial_values = ("RMSProp", "RMSProp_1"), (1.0, 0.0)

    def apply(self, var, grad, slots, scratch):
        s, t = scratch
        ms, mom = slots[0], slots[-1]
        np.multiply(grad, grad, out=s)  # ms += (g * g - ms) * (1 - rho)
        np.subtract(s, ms, out=s)
        np.multiply(s, self.one_minus_rho, out=s)
        np.add(ms, s, out=ms)
        if self.config.centered:
            mg = slots[1]
            np.subtract(grad, mg, out=s)  # mg += (g - mg) * (1 - rho)
            np.multiply(s, self.one_minus_rho, out=s)
            np.add(mg, s, out=mg)
            np.multiply(mg, mg, out=t)  # denominator sqrt(ms - mg * mg + epsilon)
            np.subtract(ms, t, out=t)
            np.add(t, self.eps, out=t)
        else:
            np.add(ms, self.eps, out=t)
        np.sqrt(t, out=t)
        np.multiply(grad, self.lr, out=s)  # mom = mom * mu + g * lr / denominator
        np.divide(s, t, out=s)
        np.multiply(mom, self.mu, out=mom)
        np.add(mom, s, out=mom)
        np.subtract(var, mom, out=var)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        ms, mom = slots[0], slots[-1]
        ms_rows = ms[rows] * self.rho + (g * g) * self.one_minus_rho
        ms[rows] = ms_rows
        if self.config.centered:
            mg = slots[1]
            mg_rows = mg[rows] * self.rho + g * self.one_minus_rho
            mg[rows] = mg_rows
            denominator = (ms_rows + self.eps) - mg_rows * mg_rows
        else:
            denominator = ms_rows + self.eps
        mom_rows = mom[rows] * self.mu + (_rsqrt(denominator) * self.lr) * g
        mom[rows] = mom_rows
        var[rows] -= mom_rows


class Adagrad(Optimizer):

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.slot_suffixes = ("Adagrad",)
        self.slot_initial_values = (float(F32(config.initial_accumulator_value)),)

    def apply(self, var, grad, slots, scratch):
        (accum,), (s, t) = slots, scratch
        np.multiply(grad, grad, out=s)
        np.add(accum, s, out=accum)
        np.multiply(grad, self.lr, out=s)  # var -= g * lr * rsqrt(accum)
        np.sqrt(accum, out=t)
        np.divide(F32(1), t, out=t)
        np.multiply(s, t, out=s)
        np.subtract(var, s, out=var)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        (accum,) = slots
        a = accum[rows] + g * g
        accum[rows] = a
        if var[0].size == 1:
            var[rows] -= (self.lr * g) / np.sqrt(a)
        else:
            var[rows] -= (self.lr * g) * _rsqrt(a)


class AdamW(Optimizer):
    """The modelzoo's AdamWOptimizer (docs/design.md, "AdamW"); slots AdamW (m), AdamW_1 (v);
    the beta powers only with bias correction."""

    scalar_names: tuple[str, ...] = Adam.scalar_names

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.beta1, self.beta2, self.eps = F32(config.beta1), F32(config.beta2), F32(config.epsilon)
        self.one_minus_beta1 = F32(config.one_minus_beta1)
        self.one_minus_beta2 = F32(config.one_minus_beta2)
        self.decay = F32(config.weight_decay_rate)
        self.slot_suffixes, self.slot_initial_values = ("AdamW", "AdamW_1"), (0.0, 0.0)
        self.scalar_names = Adam.scalar_names if config.use_bias_correction else ()
        self._undecayed: AdamW | None = None

    def initial_scalars(self):
        return {"beta1_power": np.asarray(self.beta1, F32),
                "beta2_power": np.asarray(self.beta2, F32)} if self.scalar_names else {}

    def for_variable(self, name):
        if not self.decay or name not in self.config.no_weight_decay:
            return self
        if self._undecayed is None:  # (set_hyper_parameters starts a new one)
            self._undecayed = AdamW(replace(self.config, weight_decay_rate=0.0))
        self._undecayed.scalars = self.scalars
        return self._undecayed

    def apply(self, var, grad, slots, scratch):
        (m, v), (s, t) = slots, scratch
        np.multiply(m, self.beta1, out=m)  # m = beta1 * m + (1 - beta1) * g
        np.multiply(grad, self.one_minus_beta1, out=s)
        np.add(m, s, out=m)
        np.multiply(grad, grad, out=s)  # v = beta2 * v + (1 - beta2) * g * g
        np.multiply(s, self.one_minus_beta2, out=s)
        np.multiply(v, self.beta2, out=v)
        np.add(v, s, out=v)
        np.sqrt(v, out=t)  # update = m / (sqrt(v) + epsilon)
        np.add(t, self.eps, out=t)
        np.divide(m, t, out=s)
        lr = self.lr
        if self.scalar_names:  # update *= sqrt(1 - beta2_power) / (1 - beta1_power)
            b1, b2 = F32(self.scalars["beta1_power"]), F32(self.scalars["beta2_power"])
            correction = F32(np.sqrt(F32(1) - b2) / (F32(1) - b1))
            if self.decay:
                np.multiply(s, correction, out=s)
            else:  # Grappler reassociates lr * (update * correction) of scalars lr, correction
                lr = F32(correction * lr)
        if self.decay:  # update += weight_decay_rate * var
            np.multiply(var, self.decay, out=t)
            np.add(s, t, out=s)
        np.multiply(s, lr, out=s)  # var -= lr * update
        np.subtract(var, s, out=var)

    def apply_sparse(self, var, indices, values, slots):
        """The deduplicated rows scattered into a dense gradient, then the dense rule (the
        modelzoo's sparse update converts its IndexedSlices to a tensor)."""
        rows, g = _deduplicate(indices, values)
        dense = np.zeros_like(var)
        dense[rows] = g
        self.apply(var, dense, slots, [np.empty_like(var), np.empty_like(var)])

    def finish_step(self):
        for name, beta in (("beta1_power", self.beta1), ("beta2_power", self.beta2)):
            if name in self.scalar_names:
                self.scalars[name] = np.asarray(F32(self.scalars[name]) * beta, F32)


class Adadelta(Optimizer):
    """Slots Adadelta (accum), Adadelta_1 (accum_update), both starting at zero."""

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.rho, self.eps = F32(config.decay), F32(config.epsilon)
        self.one_minus_rho = F32(1) - self.rho
        self.slot_suffixes, self.slot_initial_values = ("Adadelta", "Adadelta_1"), (0.0, 0.0)

    def _rows(self, var, grad, accum, accum_update) -> None:
        """The rule on arrays (rows of the slots, or whole slots), var in place."""
        accum[...] = accum * self.rho + (grad * grad) * self.one_minus_rho
        update = np.sqrt(accum_update + self.eps) * _rsqrt(accum + self.eps) * grad
        var -= update * self.lr
        accum_update[...] = accum_update * self.rho + (update * update) * self.one_minus_rho

    def apply(self, var, grad, slots, scratch):
        self._rows(var, grad, *slots)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        v, accum, accum_update = var[rows], slots[0][rows], slots[1][rows]
        self._rows(v, g, accum, accum_update)
        var[rows], slots[0][rows], slots[1][rows] = v, accum, accum_update


class Ftrl(Optimizer):
    """Slots Ftrl (accum, starts at initial_accumulator_value), Ftrl_1 (linear, zero)."""

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.l1, self.l2, self.shrinkage = F32(config.l1), F32(config.l2), F32(config.l2_shrinkage)
        self.slot_suffixes = ("Ftrl", "Ftrl_1")
        self.slot_initial_values = (float(F32(config.initial_accumulator_value)), 0.0)

    def apply(self, var, grad, slots, scratch):
        accum, linear = slots
        shrunk = grad + (F32(2) * self.shrinkage) * var if self.shrinkage else grad
        new_accum = accum + grad * grad
        linear += shrunk - (np.sqrt(new_accum) - np.sqrt(accum)) / self.lr * var
        x = self.l1 * np.sign(linear) - linear
        y = np.sqrt(new_accum) / self.lr + F32(2) * self.l2
        var[...] = np.where(np.abs(linear) > self.l1, x / y, F32(0))
        accum[...] = new_accum

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        accum, linear = slots
        v, a = var[rows], accum[rows]
        shrunk = g + (F32(2) * self.shrinkage) * v if self.shrinkage else g
        new_accum = a + g * g
        if var[0].size == 1:  # TF's scalar path: (l + g) - sigma * v, sigma by libm's powf
            sigma = (powf(new_accum, 0.5) - powf(a, 0.5)) / self.lr
            lin = (linear[rows] + shrunk) - sigma * v
        else:
            lin = linear[rows] + (shrunk - (np.sqrt(new_accum) - np.sqrt(a)) / self.lr * v)
        x = np.maximum(np.minimum(lin, self.l1), -self.l1) - lin
        var[rows] = x / (np.sqrt(new_accum) / self.lr + F32(2) * self.l2)
        accum[rows], linear[rows] = new_accum, lin


class ProximalAdagrad(Optimizer):
    """Slot ProximalAdagrad (accum, starts at initial_accumulator_value)."""

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.l1, self.l2 = F32(config.l1), F32(config.l2)
        self.slot_suffixes = ("ProximalAdagrad",)
        self.slot_initial_values = (float(F32(config.initial_accumulator_value)),)

    def apply(self, var, grad, slots, scratch):
        (accum,) = slots
        accum += grad * grad
        rate = self.lr * _rsqrt(accum)
        var -= grad * rate
        var[...] = _proximal(var, rate * self.l1 if self.l1 > 0 else None, self.l2 * rate)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        (accum,) = slots
        a = accum[rows] + g * g
        accum[rows] = a
        narrow = var[0].size == 1  # TF's scalar path: lr / sqrt(accum), exact
        rate = self.lr / np.sqrt(a) if narrow else self.lr * _rsqrt(a)
        v = var[rows] - g * rate
        var[rows] = _proximal(v, rate * self.l1 if self.l1 > 0 else None, self.l2 * rate, narrow)


class ProximalSGD(Optimizer):
    """tf.compat.v1.train.ProximalGradientDescentOptimizer: no slots."""

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.l1, self.l2 = F32(config.l1), F32(config.l2)

    def apply(self, var, grad, slots, scratch):
        var -= grad * self.lr
        shrink = self.lr * self.l1 if self.l1 > 0 else None
        var[...] = _proximal(var, shrink, self.l2 * self.lr)

    def apply_sparse(self, var, indices, values, slots):
        rows, g = _deduplicate(indices, values)
        v = var[rows] - g * self.lr
        shrink = self.lr * self.l1 if self.l1 > 0 else None
        var[rows] = _proximal(v, shrink, self.l2 * self.lr, var[0].size == 1)


def _proximal(v: np.ndarray, shrink, l2_rate, in_double: bool = False) -> np.ndarray:
    """sign(v) * max(|v| - shrink, 0) / (1 + l2_rate) (shrink None: v / (1 + l2_rate));
    `in_double`: the sparse kernels' scalar path (a table of one column), whose 1.0 + l2_rate
    is a double: the quotient in float64, then rounded."""
    top = v if shrink is None else np.sign(v) * np.maximum(np.abs(v) - shrink, F32(0))
    if in_double:
        return (top.astype(np.float64) / (1.0 + np.float64(l2_rate))).astype(F32)
    return top / (F32(1) + l2_rate)


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "momentum": Momentum, "adam": Adam,
                                          "rmsprop": RMSProp, "adagrad": Adagrad, "adamw": AdamW,
                                          "adadelta": Adadelta, "ftrl": Ftrl,
                                          "proximal_adagrad": ProximalAdagrad,
                                          "proximal_sgd": ProximalSGD}


# Hyper-parameters a schedule may compute per step, by optimizer (Adam's betas stay fixed:
# its beta powers multiply by them).
SCHEDULABLE = {"sgd": ("learning_rate",), "momentum": ("learning_rate", "momentum"),
               "adam": ("learning_rate", "epsilon"),
               "rmsprop": ("learning_rate", "decay", "momentum", "epsilon"),
               "adagrad": ("learning_rate",), "adamw": ("learning_rate",),
               "adadelta": ("learning_rate",),
               "ftrl": ("learning_rate", "l2"),  # FtrlOptimizer's l2 + beta / (2 * lr)
               "proximal_adagrad": ("learning_rate",), "proximal_sgd": ("learning_rate",)}


def config_problem(config: OptimizerConfig) -> str:
    """Why the CS cannot run `config` as TF would, or ""."""
    if config.type not in OPTIMIZERS:
        return f"unknown optimizer {config.type!r}; the CS system has {', '.join(OPTIMIZERS)}"
    if not np.isfinite(config.learning_rate):
        return f"optimizer {config.type}: learning rate {config.learning_rate} is not finite"
    if config.type in ("adagrad", "ftrl", "proximal_adagrad") and \
            not config.initial_accumulator_value > 0:
        return (f"optimizer {config.type}: initial_accumulator_value must be > 0 (as in TF), "
                f"got {config.initial_accumulator_value}")
    if config.type == "ftrl" and F32(config.lr_power) != F32(-0.5):
        return (f"FTRL's learning_rate_power is {config.lr_power:g}: the CS carries out -0.5 "
                "only (TF's other powers use Eigen's pow, which the CS does not reproduce)")
    return ""


def make_optimizer(config: OptimizerConfig) -> Optimizer:
    problem = config_problem(config)
    if problem:
        raise ValueError(problem)
    optimizer = OPTIMIZERS[config.type](config)
    optimizer.scalars = optimizer.initial_scalars()
    return optimizer


@dataclass(frozen=True)
class OptimizerGroup:
    """A further optimizer of the train_op and the variables it updates (a second
    `minimize(loss, var_list=...)` of model_fn's loss); the program's `optimizer` updates
    every other trained variable."""

    config: OptimizerConfig
    variables: tuple[str, ...]

    @classmethod
    def from_message(cls, message: pb.OptimizerGroup) -> "OptimizerGroup":
        return cls(OptimizerConfig.from_message(message.optimizer), tuple(message.variables))

    def to_message(self) -> pb.OptimizerGroup:
        return pb.OptimizerGroup(optimizer=self.config.to_message(), variables=list(self.variables))


@dataclass(frozen=True)
class Reupdate:
    """A weight a further optimizer (`optimizer`: 0 the program's, k its group k - 1)
    updates again after its first update, from the gradient of objective `objective`'s pass
    (taken at the weights before the step, as TF's one forward pass gives it), keeping its
    own slots under TF's names (`slots`: a second Adam's `<var>/Adam_2`, `<var>/Adam_3`)."""

    variable: str
    optimizer: int
    objective: int
    slots: tuple[str, ...]
    source: str = ""

    @classmethod
    def from_message(cls, message: pb.Reupdate) -> "Reupdate":
        return cls(message.variable, message.optimizer, message.objective,
                   tuple(message.slots), message.source)

    def to_message(self) -> pb.Reupdate:
        return pb.Reupdate(variable=self.variable, optimizer=self.optimizer,
                           objective=self.objective, slots=list(self.slots), source=self.source)


class Grouped(Optimizer):
    """Several optimizers in one step, each with its own hyper-parameters, slots and
    scalars, each variable updated by its group's (`for_variable`); every gradient is the
    one loss's, computed before any update, as TF's grouped minimize ops compute them."""

    def __init__(self, default: Optimizer, groups: Sequence[tuple[Optimizer, Sequence[str]]]):
        self.members = (default, *(o for o, _ in groups))
        self.default, self.by_variable = default, {v: o for o, names in groups for v in names}
        self.config = default.config
        self.scalar_names = tuple(n for o in self.members for n in o.scalar_names)

    @property
    def scalars(self) -> dict[str, np.ndarray]:  # type: ignore[override]
        return {name: value for o in self.members for name, value in o.scalars.items()}

    def load_scalars(self, state):
        for o in self.members:
            o.load_scalars(state)

    def set_hyper_parameters(self, values):
        raise ValueError("schedules of several optimizers: each sets its member's")

    def member(self, index: int) -> Optimizer:
        return self.members[index]

    def for_variable(self, name):
        return self.by_variable.get(name, self.default).for_variable(name)

    def finish_step(self):
        for o in self.members:
            o.finish_step()


def finish_updated(optimizer: Optimizer, trained: Iterable[str], skipped: frozenset[str],
                   reupdates: Iterable[Reupdate] = ()) -> None:
    """The step's bookkeeping (`finish_step`: Adam's beta powers) of each optimizer that
    updated one of the `trained` variables not `skipped`, or reupdated one: a group whose
    updates a tf.cond skipped this step keeps its step counters, as TF's live in the branch
    of its apply ops."""
    if not isinstance(optimizer, Grouped):
        if not skipped or any(v not in skipped for v in trained):
            optimizer.finish_step()
        return
    updated = {id(optimizer.by_variable.get(v, optimizer.default)) for v in trained
               if v not in skipped} | {id(optimizer.members[r.optimizer]) for r in reupdates}
    for member in optimizer.members:
        if id(member) in updated:
            member.finish_step()


def make_optimizers(config: OptimizerConfig, groups: Sequence[OptimizerGroup]) -> Optimizer:
    """The program's optimizer, and with further groups the optimizer of every group."""
    default = make_optimizer(config)
    if not groups:
        return default
    return Grouped(default, [(make_optimizer(g.config), g.variables) for g in groups])
