"""One optimizer step of the CS (wafer.optimizers) against tf.compat.v1.train on 65,536
random weights, gradients, slots and step counters: bit-equal for every dense rule and for
the sparse rules of embedding lookups whose ids repeat; where TF uses Eigen's approximate
rsqrt (Adagrad, sparse RMSProp) within a few float32 ULP of the step. Slot names and their
initial values are TF's, read from a real graph. AdamW is the modelzoo-shaped optimizer of
examples/modelzoo_adamw.py (with bias correction and weight decay; and with the table
excluded from weight decay by name)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from examples.modelzoo_adamw import AdamWOptimizer
from wafer.libm import powf
from wafer.optimizers import OptimizerConfig, make_optimizer, slot_name

F32 = np.float32
v1 = tf.compat.v1.train

# name: (TF optimizer, the CS's config, TF's slot names in the CS's slot order)
CASES = {
    "sgd": (lambda: v1.GradientDescentOptimizer(0.1), OptimizerConfig("sgd", 0.1), ()),
    "momentum": (lambda: v1.MomentumOptimizer(0.1, 0.9),
                 OptimizerConfig("momentum", 0.1, momentum=0.9), ("momentum",)),
    "nesterov": (lambda: v1.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
                 OptimizerConfig("momentum", 0.1, momentum=0.9, use_nesterov=True), ("momentum",)),
    "adam": (lambda: v1.AdamOptimizer(0.01, 0.8, 0.99, 1e-7),
             OptimizerConfig("adam", 0.01, beta1=0.8, beta2=0.99, epsilon=1e-7), ("m", "v")),
    "rmsprop": (lambda: v1.RMSPropOptimizer(0.01),
                OptimizerConfig("rmsprop", 0.01, decay=0.9, epsilon=1e-10), ("rms", "momentum")),
    "rmsprop_momentum": (lambda: v1.RMSPropOptimizer(0.01, 0.95, 0.9, 1e-6),
                         OptimizerConfig("rmsprop", 0.01, decay=0.95, momentum=0.9, epsilon=1e-6),
                         ("rms", "momentum")),
    "rmsprop_centered": (lambda: v1.RMSPropOptimizer(0.01, 0.95, 0.9, 1e-6, centered=True),
                         OptimizerConfig("rmsprop", 0.01, decay=0.95, momentum=0.9, epsilon=1e-6,
                                         centered=True), ("rms", "mg", "momentum")),
    "adagrad": (lambda: v1.AdagradOptimizer(0.1, 0.2),
                OptimizerConfig("adagrad", 0.1, initial_accumulator_value=0.2), ("accumulator",)),
    "adamw": (lambda: AdamWOptimizer(0.01, 0.02, 0.8, 0.99, 1e-7, use_bias_correction=True),
              OptimizerConfig("adamw", 0.01, beta1=0.8, beta2=0.99, epsilon=1e-7,
                              weight_decay_rate=0.02, use_bias_correction=True,
                              one_minus_beta1=1.0 - 0.8, one_minus_beta2=1.0 - 0.99), ("m", "v")),
    "adamw_excluded": (lambda: AdamWOptimizer(0.01, 0.02, use_bias_correction=True,
                                              exclude_from_weight_decay=["^em"]),
                       OptimizerConfig("adamw", 0.01, beta1=0.9, beta2=0.999, epsilon=1e-6,
                                       weight_decay_rate=0.02, no_weight_decay=("emb",),
                                       use_bias_correction=True,
                                       one_minus_beta1=1.0 - 0.9, one_minus_beta2=1.0 - 0.999),
                       ("m", "v")),
    "adadelta": (lambda: v1.AdadeltaOptimizer(0.5, 0.9, 1e-6),
                 OptimizerConfig("adadelta", 0.5, decay=0.9, epsilon=1e-6),
                 ("accum", "accum_update")),
    "ftrl": (lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                      l2_regularization_strength=0.02),
             OptimizerConfig("ftrl", 0.1, lr_power=-0.5, l1=0.01, l2=0.02,
                             initial_accumulator_value=0.1), ("accum", "linear")),
    "ftrl_shrinkage": (lambda: v1.FtrlOptimizer(0.1, -0.5, 0.2, 0.01, 0.02,
                                                l2_shrinkage_regularization_strength=0.05),
                       OptimizerConfig("ftrl", 0.1, lr_power=-0.5, l1=0.01, l2=0.02,
                                       l2_shrinkage=0.05, initial_accumulator_value=0.2),
                       ("accum", "linear")),
    "proximal_adagrad": (lambda: v1.ProximalAdagradOptimizer(0.1, 0.2, 0.001, 0.01),
                         OptimizerConfig("proximal_adagrad", 0.1, l1=0.001, l2=0.01,
                                         initial_accumulator_value=0.2), ("accumulator",)),
    "proximal_sgd": (lambda: v1.ProximalGradientDescentOptimizer(0.1, 0.05, 0.01),
                     OptimizerConfig("proximal_sgd", 0.1, l1=0.05, l2=0.01), ()),
    "proximal_sgd_l2": (lambda: v1.ProximalGradientDescentOptimizer(0.1, 0.0, 0.01),
                        OptimizerConfig("proximal_sgd", 0.1, l2=0.01), ()),
}
# (optimizer, sparse) whose TF kernel computes Eigen's fast rsqrt on packets of values
APPROXIMATE = {("adagrad", False), ("adagrad", True), ("rmsprop", True),
               ("rmsprop_momentum", True), ("rmsprop_centered", True), ("adadelta", False),
               ("adadelta", True), ("proximal_adagrad", False), ("proximal_adagrad", True)}
# Measured 2-4 ULP of the step (AMD EPYC); one Newton step on a 12-bit estimate, without
# FMA, bounds the error of TF's rsqrt near 2^-21.5, about 6 ULP, on any x86 processor.
MAX_STEP_ULP = 6
# ProximalAdagrad's regularisation rounds 4 more times after the estimate (a * l1, the
# difference, the denominator, the quotient): measured 8 ULP
MAX_STEP_ULP_OF = {"proximal_adagrad": MAX_STEP_ULP + 4}


def random_slots(names, shape, rng) -> dict[str, np.ndarray]:
    slots = {}
    for n in names:
        if n in ("v", "rms", "accumulator", "accum", "accum_update"):  # non-negative accumulators
            slots[n] = rng.random(shape, dtype=F32) + F32(0.01)
        else:
            slots[n] = rng.normal(size=shape).astype(F32) * F32(0.1)
    if "mg" in slots:  # the centered variance stays positive
        slots["rms"] += slots["mg"] ** 2
    return slots


def tf_step(case: str, var0, slots0, powers, feed_grad=None, ids=None, values=None):
    """One tf.compat.v1 step from the given state: a dense gradient `feed_grad`, or the
    gradient of an embedding lookup of `ids` (values per id `values`, via a real graph)."""
    make, _, slot_names = CASES[case]
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("emb", initializer=var0)
        if ids is None:
            grad = tf.compat.v1.placeholder(tf.float32, var0.shape)
            loss, feed = tf.reduce_sum(var * grad), {grad: feed_grad}
        else:  # the ids are input data (a placeholder), as a model's features are
            ids_in = tf.compat.v1.placeholder(tf.int64, ids.shape)
            upstream = tf.compat.v1.placeholder(tf.float32, values.shape)
            loss = tf.reduce_sum(tf.nn.embedding_lookup(var, ids_in) * upstream)
            feed = {ids_in: ids, upstream: values}
        opt = make()
        train = opt.minimize(loss)
        slots = [opt.get_slot(var, n) for n in slot_names]
        scalars = {v.op.name: v for v in tf.compat.v1.global_variables()
                   if v.op.name in ("beta1_power", "beta2_power")}
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            initial = [session.run(s) for s in slots]
            for s, value in zip(slots, slots0):
                s.load(value, session)
            for name, s in scalars.items():
                s.load(powers[name], session)
            session.run(train, feed)
            return {"var": session.run(var),
                    "slots": [session.run(s) for s in slots],
                    "slot_names": [s.op.name for s in slots],
                    "initial": initial,
                    "scalars": {n: session.run(s) for n, s in scalars.items()}}


def cs_step(case: str, var0, slots0, powers, grad=None, ids=None, values=None):
    optimizer = make_optimizer(CASES[case][1])
    optimizer.scalars.update({n: np.asarray(p, F32) for n, p in powers.items()})
    var, slots = var0.copy(), [s.copy() for s in slots0]
    rule = optimizer.for_variable("emb")
    if ids is None:
        rule.apply(var, grad, slots, [np.empty_like(var), np.empty_like(var)])
    else:
        rule.apply_sparse(var, ids.reshape(-1), values.reshape((-1,) + var.shape[1:]), slots)
    optimizer.finish_step()
    return optimizer, var, slots


def run_both(case: str, sparse: bool, shape=(256, 256), seed=0, zero_start=False):
    """TF's and the CS's step from the same random state; `zero_start`: weights and
    momentum accumulators zero, so that the updated weights are the (negated) steps."""
    rng = np.random.default_rng(seed)
    var0 = rng.normal(size=shape).astype(F32)
    slots = random_slots(CASES[case][2], shape, rng)
    if zero_start:
        var0[...] = slots.get("momentum", var0)[...] = 0
    slots0 = list(slots.values())
    powers = {"beta1_power": F32(0.8) ** 3, "beta2_power": F32(0.99) ** 3}
    if sparse:  # 768 ids drawn from a quarter of the table: most repeat, most rows untouched
        ids = rng.integers(0, max(shape[0] // 4, 1), (64, 12))
        values = rng.normal(size=ids.shape + shape[1:]).astype(F32)
        ref = tf_step(case, var0, slots0, powers, ids=ids, values=values)
        cs = cs_step(case, var0, slots0, powers, ids=ids, values=values)
    else:
        grad = rng.normal(size=shape).astype(F32)
        ref = tf_step(case, var0, slots0, powers, feed_grad=grad)
        cs = cs_step(case, var0, slots0, powers, grad=grad)
    return var0, ref, cs


@pytest.mark.parametrize("case", CASES)
def test_slots_are_named_and_initialised_as_tf_does(case):
    _, ref, (optimizer, _, _) = run_both(case, sparse=False, shape=(4, 3))
    assert ref["slot_names"] == [slot_name("emb", s) for s in optimizer.slot_suffixes]
    assert [float(a.flat[0]) for a in ref["initial"]] == \
        [float(F32(v)) for v in optimizer.slot_initial_values]
    assert sorted(ref["scalars"]) == sorted(optimizer.scalar_names)


@pytest.mark.parametrize("case,sparse", [(c, s) for c in CASES for s in (False, True)
                                         if (c, s) not in APPROXIMATE])
def test_one_step_is_bit_equal_to_tf(case, sparse):
    _, ref, (optimizer, var, slots) = run_both(case, sparse)
    np.testing.assert_array_equal(var, ref["var"])
    for name, mine, theirs in zip(ref["slot_names"], slots, ref["slots"]):
        np.testing.assert_array_equal(mine, theirs, err_msg=name)
    for name, value in ref["scalars"].items():
        assert optimizer.scalars[name] == value, name


@pytest.mark.parametrize("case,shape", [
    (c, s) for c in ("adagrad", "rmsprop_momentum", "rmsprop_centered", "adadelta",
                     "proximal_adagrad", "proximal_sgd", "proximal_sgd_l2")
    for s in ((64,), (64, 1), (64, 12))] + [
    (c, s) for c in ("ftrl", "ftrl_shrinkage") for s in ((64,), (64, 1), (64, 12))])
def test_sparse_rules_of_narrow_tables_without_vector_rsqrt_are_bit_equal(case, shape):
    """A table of one column takes TF's scalar path (1 / sqrt, exact); Eigen's packets of
    8 floats leave the last 4 of 12 columns to the scalar path too. (FTRL's scalar path
    takes square roots with glibc's powf(x, 0.5), 1 ULP from sqrt for some x: the CS calls
    the same powf.)"""
    _, ref, (_, var, slots) = run_both(case, sparse=True, shape=shape)
    columns = slice(None) if len(shape) == 1 or shape[1] == 1 else slice(8, None)
    np.testing.assert_array_equal(var[..., columns], ref["var"][..., columns])
    for mine, theirs in zip(slots, ref["slots"]):
        np.testing.assert_array_equal(mine[..., columns], theirs[..., columns])


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between two float32 arrays in units in the last place."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(ordered(a) - ordered(b))))


@pytest.mark.parametrize("case,sparse", sorted(APPROXIMATE))
def test_approximate_rsqrt_rules_stay_within_a_few_ulp(case, sparse):
    """From zero weights (and momentum) the updated weights are the steps themselves:
    TF's rsqrt estimate and the CS's 1 / sqrt give steps at most MAX_STEP_ULP apart."""
    _, ref, (_, var, slots) = run_both(case, sparse, zero_start=True)
    assert 0 < ulps(var, ref["var"]) <= MAX_STEP_ULP_OF.get(case, MAX_STEP_ULP)
    np.testing.assert_array_equal(slots[0], ref["slots"][0])  # the accumulator is exact


def test_unknown_optimizer_and_bad_adagrad_are_refused():
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'; the CS system has sgd, "
                                         "momentum, adam, rmsprop, adagrad"):
        make_optimizer(OptimizerConfig("lamb", 0.1))
    with pytest.raises(ValueError, match="initial_accumulator_value must be > 0"):
        make_optimizer(OptimizerConfig("adagrad", 0.1, initial_accumulator_value=0.0))
    with pytest.raises(ValueError, match="FTRL's learning_rate_power is -0.3: the CS carries "
                                         "out -0.5 only"):
        make_optimizer(OptimizerConfig("ftrl", 0.1, lr_power=-0.3, initial_accumulator_value=0.1))


def test_ftrl_on_a_table_of_one_column_takes_tfs_powf_square_roots():
    """TF's sparse FTRL on a table of one column computes sigma = (pow(new, 0.5) -
    pow(accum, 0.5)) / lr with glibc's powf: on accumulators where powf(x, 0.5) is not the
    correctly rounded sqrt(x), the CS's step equals TF's bit for bit (and sqrt would not)."""
    rng = np.random.default_rng(3)
    candidates = rng.uniform(0.1, 100.0, 400_000).astype(F32)
    odd = candidates[powf(candidates, 0.5) != np.sqrt(candidates)][:64]
    assert len(odd) == 64
    var0 = rng.normal(size=(64, 1)).astype(F32)
    slots0 = [odd[:, None], rng.normal(size=(64, 1)).astype(F32)]
    ids, values = np.arange(64)[:, None], (1e-3 * rng.normal(size=(64, 1, 1))).astype(F32)
    ref = tf_step("ftrl", var0, slots0, {}, ids=ids, values=values)
    _, var, slots = cs_step("ftrl", var0, slots0, {}, ids=ids, values=values)
    np.testing.assert_array_equal(var, ref["var"])
    np.testing.assert_array_equal(slots[1], ref["slots"][1])
    g, lr = values.reshape(64, 1), F32(0.1)
    by_sqrt = (slots0[1] + g) - (np.sqrt(odd[:, None] + g * g) - np.sqrt(odd[:, None])) / lr * var0
    assert not np.array_equal(by_sqrt, ref["slots"][1])
