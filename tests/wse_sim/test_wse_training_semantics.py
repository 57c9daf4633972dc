"""Training semantics of the CS beyond the optimizer rule, against TensorFlow: gradient
transforms (tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm, scaling) alone and
in training, frozen weights (var_list), backward passes only where needed, regularizers,
RMSProp and Adagrad from TF's initial slots, 1 vs 2 stages bit-identical, dropout masks
that continue across a resume, and precise refusals of bad programs."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from doubles import ClientDouble

from cs_api import cs_api_pb2 as pb
from cs_api.attrs import to_attr
from wafer.grad_transforms import GradientTransform, apply_transforms
from wse_sim.errors import CSError
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program, check_state

F32 = np.float32
SHAPES = {"dense/kernel": (784, 500), "dense/bias": (500,), "out/kernel": (500, 10),
          "out/bias": (10,), "emb": (1000, 17)}
# measured 2 (clip_by_norm) and 3 (clip_by_global_norm) ULP: the sums of squares in another order
MAX_CLIPPED_ULP = 4


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    def ordered(x):
        i = np.asarray(x, F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(ordered(a) - ordered(b))))


def tf_transform(kind: str, grads: list[np.ndarray], value: float, low: float, high: float):
    g = [tf.constant(x) for x in grads]
    if kind == "scale":
        return [x * F32(value) for x in g]
    if kind == "clip_by_value":
        return [tf.clip_by_value(x, F32(low), F32(high)) for x in g]
    if kind == "clip_by_norm":
        return [tf.clip_by_norm(x, F32(value)) for x in g]
    return tf.clip_by_global_norm(g, F32(value))[0]


@pytest.mark.parametrize("kind", ["scale", "clip_by_value", "clip_by_norm", "clip_by_global_norm"])
def test_transforms_equal_tf_on_random_gradients(kind):
    """Random gradients of FC-MNIST-like shapes over eight orders of magnitude, so that some
    are clipped and some not: unclipped gradients are bit-equal, clipped ones within a few
    ULP (the norm's float32 sum), elementwise transforms always bit-equal."""
    rng = np.random.default_rng(7)
    names = list(SHAPES)
    clipped = unclipped = 0
    for trial in range(12):
        magnitude = 10 ** rng.uniform(-5, 1)
        grads = [rng.normal(size=s).astype(F32) * F32(magnitude * 10 ** rng.uniform(-1, 1))
                 for s in SHAPES.values()]
        value = float(F32(10 ** rng.uniform(-1, 2)))
        low, high = -value / 3, value
        ref = [np.asarray(r) for r in tf_transform(kind, grads, value, low, high)]
        mine = {n: g.copy() for n, g in zip(names, grads)}
        apply_transforms([GradientTransform(kind, value, low, high, tuple(names))], mine)
        for name, g, r in zip(names, grads, ref):
            factor_applied = kind in ("clip_by_norm", "clip_by_global_norm") and not np.array_equal(
                r, (g * F32(value)) / F32(value) if kind == "clip_by_norm"
                else g * (F32(value) * (F32(1) / F32(value))))
            if factor_applied:
                clipped += 1
                assert ulps(mine[name], r) <= MAX_CLIPPED_ULP, (trial, name)
            else:
                unclipped += 1
                np.testing.assert_array_equal(mine[name], r, err_msg=f"{trial} {name}")
    if kind in ("clip_by_norm", "clip_by_global_norm"):
        assert clipped and unclipped  # both regimes were exercised


def test_transforms_apply_in_order_to_their_variables_only():
    grads = {"a": np.array([3.0, -4.0], F32), "b": np.array([10.0], F32), "c": np.array([1.0], F32)}
    apply_transforms([GradientTransform("scale", 2.0, variables=("a", "b")),
                      GradientTransform("clip_by_global_norm", 5.0, variables=("a",)),
                      GradientTransform("clip_by_value", low=-1.0, high=4.0, variables=("a", "b"))],
                     grads)
    np.testing.assert_array_equal(grads["a"], np.array([3.0, -1.0], F32))  # 6,-8 -> 3,-4 -> clip
    np.testing.assert_array_equal(grads["b"], np.array([4.0], F32))
    np.testing.assert_array_equal(grads["c"], np.array([1.0], F32))


def test_non_finite_global_norm_makes_every_gradient_nan_as_in_tf():
    grads = {"a": np.array([np.inf, 1.0], F32), "b": np.array([2.0], F32)}
    apply_transforms([GradientTransform("clip_by_global_norm", 1.0, variables=("a", "b"))], grads)
    assert np.isnan(grads["a"]).all() and np.isnan(grads["b"]).all()


def test_transform_message_round_trip_and_refusals():
    t = GradientTransform("clip_by_value", low=-1.5, high=2.0, variables=("w", "b"))
    assert GradientTransform.from_message(pb.GradientTransform.FromString(
        t.to_message().SerializeToString())) == t
    with pytest.raises(ValueError, match="unknown gradient transform 'clip_by_average_norm'; "
                                         "the CS system has scale, clip_by_value"):
        GradientTransform("clip_by_average_norm", 1.0, variables=("w",))
    with pytest.raises(ValueError, match="clip_by_norm needs a finite clip norm > 0, got 0.0"):
        GradientTransform("clip_by_norm", 0.0, variables=("w",))
    with pytest.raises(ValueError, match="gradient transform scale names no variables"):
        GradientTransform("scale", 2.0)
    with pytest.raises(KeyError, match="no gradient for 'x'"):
        apply_transforms([GradientTransform("scale", 2.0, variables=("x",))], {})


def centralization(variable: str, shape: list[int], reads: str = "") -> pb.WeightProgram:
    """A gradient program g - mean(g, axis 0) (subtracting `reads`' value too when named)."""
    grad = variable + ":grad"
    program = pb.WeightProgram(sources=[pb.Param(role="gradient", variable=grad, shape=shape)])
    mean = program.kernels.add(name="mean", type="reduce", inputs=[grad],
                               output_shape=[1, *shape[1:]])
    for key, value in {"op": "mean", "axes": [0], "keepdims": True}.items():
        mean.attrs[key].CopyFrom(to_attr(value))
    sub = program.kernels.add(name="sub", type="binary", inputs=[grad, "mean"], output_shape=shape)
    for key, value in {"op": "sub", "operands": "ii"}.items():
        sub.attrs[key].CopyFrom(to_attr(value))
    if reads:
        program.sources.add(role="source", variable=reads, shape=shape)
        last = program.kernels.add(name="minus", type="binary", inputs=["sub", reads],
                                   output_shape=shape)
        for key, value in {"op": "sub", "operands": "ii"}.items():
            last.attrs[key].CopyFrom(to_attr(value))
    return program


def test_a_program_transform_computes_its_last_kernel_from_the_gradient_and_weights():
    rng = np.random.default_rng(3)
    g, w = rng.normal(size=(5, 3)).astype(F32), rng.normal(size=(5, 3)).astype(F32)
    t = GradientTransform("program", variables=("w",), program=centralization("w", [5, 3], "v"))
    assert t.weights == ("v",)
    again = GradientTransform.from_message(pb.GradientTransform.FromString(
        t.to_message().SerializeToString()))
    grads = {"w": g.copy()}
    apply_transforms([again], grads, {"v": w})
    assert np.array_equal(grads["w"], (g - np.sum(g, 0, keepdims=True, dtype=F32) / F32(5)) - w)
    with pytest.raises(ValueError, match="must read it and compute a float32 value of its shape"):
        GradientTransform("program", variables=("b",), program=centralization("w", [5, 3]))
    with pytest.raises(ValueError, match="a program \\(and only it\\) has kernels"):
        GradientTransform("program", variables=("w",))


# ---- the pipeline's training semantics, against tf.compat.v1 on a small MLP ----
FEATURES, BATCH, MICRO = 12, 16, 4
REGION = pb.Region(x=0, y=0, width=2, height=2)
LAYERS = (("h1", FEATURES, 16, "relu"), ("h2", 16, 8, "relu"), ("logits", 8, 5, "linear"))


def mlp_program(optimizer: pb.Optimizer, *, frozen=(), regularizers=None, transforms=(),
                dropout: float = 0.0, stop_gradient: bool = False) -> pb.Program:
    """features -> dense relu -> [dropout] [stop_gradient] -> dense relu -> dense ->
    mean sparse softmax cross-entropy."""
    p = pb.Program(name="mlp", fabric="cs1", batch_size=BATCH, micro_batch_size=MICRO,
                   loss_kernel="loss", seed=-7, optimizer=optimizer,
                   gradient_transforms=[t.to_message() for t in transforms])
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=[FEATURES])
    p.inputs.add(name="labels", dtype=pb.INT32, shape=[])
    source = "features"
    for name, n, units, activation in LAYERS:
        k = p.kernels.add(name=name, type="dense", inputs=[source], output_shape=[units],
                          region=REGION)
        k.attrs["units"].i, k.attrs["use_bias"].b, k.attrs["activation"].s = units, True, activation
        for role, shape in (("kernel", [n, units]), ("bias", [units])):
            var = f"{name}/{role}"
            k.params.add(role=role, variable=var, shape=shape, dtype=pb.FLOAT32,
                         frozen=var in frozen, regularizers=(regularizers or {}).get(var, []))
        source = name
        if name == "h1" and dropout:
            d = p.kernels.add(name="drop", type="dropout", inputs=[source], output_shape=[units],
                              region=REGION)
            d.attrs["rate"].f = dropout
            source = "drop"
        if name == "h1" and stop_gradient:
            p.kernels.add(name="stop", type="stop_gradient", inputs=[source],
                          output_shape=[units], region=REGION)
            source = "stop"
    add_loss(p, source)
    return p


def add_loss(p: pb.Program, logits: str) -> None:
    """The mean sparse softmax cross-entropy of `logits` against the labels."""
    ce = p.kernels.add(name="xent", type="softmax_cross_entropy_with_logits",
                       inputs=[logits, "labels"], output_shape=[], region=REGION)
    ce.attrs["sparse"].b = True
    loss = p.kernels.add(name="loss", type="loss", inputs=["xent"], output_shape=[],
                         region=REGION)
    loss.attrs["scale"].f = 1 / p.batch_size


def mlp_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for name, n, units, _ in LAYERS:
        weights[f"{name}/kernel"] = rng.normal(size=(n, units)).astype(F32) * F32(0.5)
        weights[f"{name}/bias"] = rng.normal(size=units).astype(F32) * F32(0.1)
    return weights


def mlp_batches(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"features": rng.normal(size=(BATCH, FEATURES)).astype(F32),
             "labels": rng.integers(0, 5, BATCH).astype(np.int32)} for _ in range(count)]


def cs_train(program: pb.Program, weights, batches, *, stages: int = 1):
    """Losses and final state of training `program` on `batches` in the simulator."""
    checked = check_program(program)
    pipeline = Pipeline.load(checked, check_state(checked, weights), threads=stages,
                             min_stage_flops=0)
    try:
        assert pipeline.stages == stages
        losses = [pipeline.run(b, training=True, step=s).loss for s, b in enumerate(batches)]
        return losses, {k: np.array(v) for k, v in pipeline.state().items()}, pipeline
    finally:
        pipeline.close()


def tf_train(make_optimizer, weights, batches, *, var_list=None, l2=None, l1=None,
             transform=None, stop_gradient=False):
    """The same model in a tf.compat.v1 graph: losses (before each update) and the final
    variables. l2 / l1: {variable: c} adding c * tf.nn.l2_loss(w) / c * sum(|w|) to the loss;
    transform: a function of the list of gradients, between compute and apply."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, FEATURES))
        y = tf.compat.v1.placeholder(tf.int32, (None,))
        variables, h = {}, x
        for name, _, _, activation in LAYERS:
            for role in ("kernel", "bias"):
                var = f"{name}/{role}"
                variables[var] = tf.compat.v1.get_variable(var, initializer=weights[var])
            h = tf.matmul(h, variables[f"{name}/kernel"]) + variables[f"{name}/bias"]
            h = tf.nn.relu(h) if activation == "relu" else h
            h = tf.stop_gradient(h) if name == "h1" and stop_gradient else h
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, h)
        for var, c in (l2 or {}).items():
            loss = loss + c * tf.nn.l2_loss(variables[var])
        for var, c in (l1 or {}).items():
            loss = loss + c * tf.reduce_sum(tf.abs(variables[var]))
        optimizer = make_optimizer()
        trained = [variables[v] for v in (var_list or variables)]
        grads_and_vars = [(g, v) for g, v in optimizer.compute_gradients(loss, var_list=trained)
                          if g is not None]  # as apply_gradients skips them
        trained = [v for _, v in grads_and_vars]
        if transform is not None:
            grads = transform([g for g, _ in grads_and_vars])
            grads_and_vars = list(zip(grads, trained))
        train = optimizer.apply_gradients(grads_and_vars)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            losses = [float(session.run([loss, train], {x: b["features"], y: b["labels"]})[0])
                      for b in batches]
            state = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()}
    return losses, state


def assert_matches_tf(cs, reference, names):
    losses, state, _ = cs
    ref_losses, ref_state = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    for name in names:
        np.testing.assert_allclose(state[name], ref_state[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)


MOMENTUM = pb.Optimizer(type="momentum", learning_rate=0.1, momentum=0.9)


def tf_momentum():
    return tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)


def test_frozen_weights_stay_and_pass_gradients_to_trained_ones_upstream():
    """minimize(var_list=...) without h2: h2 never moves, h1 below it trains through it."""
    weights, batches = mlp_weights(), mlp_batches(4)
    frozen = ("h2/kernel", "h2/bias")
    cs = cs_train(mlp_program(MOMENTUM, frozen=frozen), weights, batches)
    trained = [v for v in weights if v not in frozen]
    assert_matches_tf(cs, tf_train(tf_momentum, weights, batches, var_list=trained),
                      trained + [f"{v}/Momentum" for v in trained])
    _, state, pipeline = cs
    for var in frozen:
        np.testing.assert_array_equal(state[var], weights[var])
        assert f"{var}/Momentum" not in state  # TF makes no slot for an untrained variable
    assert not np.array_equal(state["h1/kernel"], weights["h1/kernel"])
    assert pipeline.by_name["h2"].backward and pipeline.by_name["h2"].trained == ()
    # a slot of a now frozen weight (an earlier run trained it) comes back as it was loaded
    earlier = np.full((16, 8), 0.25, F32)
    state = cs_train(mlp_program(MOMENTUM, frozen=frozen),
                     {**weights, "h2/kernel/Momentum": earlier}, batches[:1])[1]
    np.testing.assert_array_equal(state["h2/kernel/Momentum"], earlier)


def test_a_region_runs_backward_only_when_something_upstream_trains():
    """With h1 frozen, nothing below h2 trains: h1 has no backward pass (and no gradient
    accumulator), the rest trains as TF trains it."""
    weights, batches = mlp_weights(), mlp_batches(3)
    frozen = ("h1/kernel", "h1/bias")
    cs = cs_train(mlp_program(MOMENTUM, frozen=frozen), weights, batches)
    trained = [v for v in weights if v not in frozen]
    assert_matches_tf(cs, tf_train(tf_momentum, weights, batches, var_list=trained), trained)
    pipeline = cs[2]
    assert not pipeline.by_name["h1"].backward and not pipeline.by_name["h1"].grads
    assert pipeline.by_name["h2"].backward
    assert pipeline.by_name["h2"].input_grads == (False,)


def test_stop_gradient_ends_the_backward_pass():
    """Below a tf.stop_gradient nothing trains (TF's gradients there are None)."""
    weights, batches = mlp_weights(), mlp_batches(3)
    cs = cs_train(mlp_program(MOMENTUM, stop_gradient=True), weights, batches)
    assert_matches_tf(cs, tf_train(tf_momentum, weights, batches, stop_gradient=True),
                      list(weights))
    _, state, pipeline = cs
    np.testing.assert_array_equal(state["h1/kernel"], weights["h1/kernel"])
    assert "h1/kernel/Momentum" not in state
    assert not pipeline.by_name["h1"].backward and not pipeline.by_name["stop"].backward


def test_regularizers_add_to_the_loss_and_the_gradient_once_per_batch():
    weights, batches = mlp_weights(), mlp_batches(4)
    regularizers = {"h1/kernel": [pb.Regularizer(kind="l2", scale=0.05 / 2)],
                    "logits/kernel": [pb.Regularizer(kind="l1", scale=0.01)],
                    "h2/kernel": [pb.Regularizer(kind="l2", scale=0.03 / 2)]}
    cs = cs_train(mlp_program(MOMENTUM, frozen=("h2/kernel",), regularizers=regularizers),
                  weights, batches)
    trained = [v for v in weights if v != "h2/kernel"]
    reference = tf_train(tf_momentum, weights, batches, var_list=trained,
                         l2={"h1/kernel": 0.05, "h2/kernel": 0.03}, l1={"logits/kernel": 0.01})
    assert_matches_tf(cs, reference, trained)
    without = cs_train(mlp_program(MOMENTUM, frozen=("h2/kernel",)), weights, batches[:1])
    assert cs[0][0] > without[0][0] + 0.1  # the terms are in the reported loss


GLOBAL_NORM = 0.05  # small enough that every batch is clipped


def transforms_for(variables):
    return (GradientTransform("scale", 0.5, variables=tuple(variables)),
            GradientTransform("clip_by_global_norm", GLOBAL_NORM, variables=tuple(variables)),
            GradientTransform("clip_by_value", low=-0.01, high=0.02, variables=("logits/bias",)))


def tf_transforms(grads):
    grads = [g * F32(0.5) for g in grads]
    grads, _ = tf.clip_by_global_norm(grads, F32(GLOBAL_NORM))
    return grads[:-1] + [tf.clip_by_value(grads[-1], F32(-0.01), F32(0.02))]


def test_gradient_transforms_apply_to_the_whole_batch_before_any_update():
    weights, batches = mlp_weights(), mlp_batches(4)
    variables = list(weights)  # logits/bias last, as tf_transforms expects
    cs = cs_train(mlp_program(MOMENTUM, regularizers={"h1/kernel": [pb.Regularizer(
        kind="l2", scale=0.01)]}, transforms=transforms_for(variables)), weights, batches)
    reference = tf_train(tf_momentum, weights, batches, l2={"h1/kernel": 0.02},
                         transform=tf_transforms)
    assert_matches_tf(cs, reference, variables)


def test_two_stages_are_bit_identical_to_one_with_transforms_and_dropout():
    weights, batches = mlp_weights(), mlp_batches(4)
    program = mlp_program(pb.Optimizer(type="rmsprop", learning_rate=0.01, decay=0.9,
                                       momentum=0.5, epsilon=1e-7, centered=True),
                          transforms=transforms_for(list(weights)), dropout=0.25)
    one, two = cs_train(program, weights, batches), cs_train(program, weights, batches, stages=2)
    assert one[0] == two[0]
    assert one[1].keys() == two[1].keys()
    for name in one[1]:
        np.testing.assert_array_equal(one[1][name], two[1][name], err_msg=name)


@pytest.mark.parametrize("optimizer,tf_optimizer", [
    (pb.Optimizer(type="rmsprop", learning_rate=0.01, decay=0.9, momentum=0.5, epsilon=1e-7,
                  centered=True),
     lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, 0.9, 0.5, 1e-7, centered=True)),
    (pb.Optimizer(type="adagrad", learning_rate=0.1, initial_accumulator_value=0.2),
     lambda: tf.compat.v1.train.AdagradOptimizer(0.1, 0.2)),
], ids=["rmsprop", "adagrad"])
def test_new_optimizers_train_from_tf_initial_slots(optimizer, tf_optimizer):
    """No slot given at load: RMSProp's mean square starts at one, Adagrad's accumulator at
    its initial value, as in TF; the slots come back under TF's names."""
    weights, batches = mlp_weights(), mlp_batches(3)
    cs = cs_train(mlp_program(optimizer), weights, batches)
    reference = tf_train(tf_optimizer, weights, batches)
    slots = [n for n in reference[1] if n not in weights]
    assert slots and set(slots) <= set(cs[1])
    assert_matches_tf(cs, reference, list(weights) + slots)


def test_a_resumed_run_draws_the_dropout_masks_of_an_unbroken_one(server):
    """2 steps, snapshot, a new job loaded at global step 2, 3 more steps: the losses and
    weights of an unbroken 5-step run, through the CS system over gRPC."""
    program = mlp_program(MOMENTUM, dropout=0.5)
    weights, batches = mlp_weights(), mlp_batches(5)

    def train(tensors, first, steps):
        client = ClientDouble(server.address)
        client.load(program, tensors, global_step=first, first_batch=first)
        client.feed_in_background(batches[first:first + steps], first=first)
        results, _ = client.run("train", steps)
        state = client.snapshot()
        client.unload()
        return [r.loss for r in results], state

    unbroken_losses, unbroken = train(weights, 0, 5)
    first_losses, halfway = train(weights, 0, 2)
    resumed_losses, resumed = train(halfway, 2, 3)
    assert first_losses + resumed_losses == unbroken_losses
    assert resumed.keys() == unbroken.keys()
    for name in unbroken:
        np.testing.assert_array_equal(resumed[name], unbroken[name], err_msg=name)
    no_dropout_losses, _ = cs_train(mlp_program(MOMENTUM), weights, batches)[:2]
    assert no_dropout_losses != unbroken_losses  # the masks did drop values


def test_each_step_draws_its_own_masks():
    """A forward pass in training mode (no optimizer: the weights stay): the masks of a
    step are a function of the step, with the dropout rate's keep probability."""
    checked = check_program(mlp_program(pb.Optimizer(), dropout=0.5))
    pipeline = Pipeline.load(checked, check_state(checked, mlp_weights()))
    batch = mlp_batches(1)[0]

    def kept(step):
        out = pipeline.run(batch, training=True, step=step, outputs=["h1", "drop"]).outputs
        np.testing.assert_array_equal(out["drop"][out["drop"] != 0],
                                      out["h1"][out["drop"] != 0] * F32(2))
        return out["drop"][out["h1"] != 0] != 0

    first, second, again = kept(0), kept(1), kept(0)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)
    assert 0.35 < np.mean(np.concatenate([first, second])) < 0.65


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_dropout_keeps_and_scales_as_tf_nn_dropout(rate):
    """Over 2**18 values (sigma of the kept fraction < 0.001): the CS keeps 1 - rate of
    them, as tf.nn.dropout does, and scales what it keeps by TF's float32 1 / (1 - rate),
    bit for bit."""
    shape, batch = (256,), 1024
    p = pb.Program(name="dropout", fabric="cs1", batch_size=batch, micro_batch_size=64, seed=3)
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=shape)
    d = p.kernels.add(name="drop", type="dropout", inputs=["features"], output_shape=shape,
                      region=REGION)
    d.attrs["rate"].f = rate
    checked = check_program(p)
    x = np.random.default_rng(0).uniform(0.5, 2.0, (batch,) + shape).astype(F32)
    cs = Pipeline.load(checked, {}).run({"features": x}, training=True, step=5,
                                        outputs=["drop"]).outputs["drop"]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        ref = session.run(tf.nn.dropout(tf.constant(x), rate=rate, seed=11))
    for out in (cs, ref):
        kept = out != 0
        assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / x.size)
        np.testing.assert_array_equal(out[kept], x[kept] * F32(1 / (1 - rate)))


def refusal(program: pb.Program, tensors=None) -> str:
    with pytest.raises(CSError) as error:
        checked = check_program(program)
        check_state(checked, tensors if tensors is not None else mlp_weights())
    return error.value.message


def edited(edit, optimizer=MOMENTUM) -> pb.Program:
    program = mlp_program(optimizer)
    edit(program)
    return program


def param(program, kernel, role):
    k = next(k for k in program.kernels if k.name == kernel)
    return next(p for p in k.params if p.role == role)


@pytest.mark.parametrize("edit,message", [
    (lambda p: setattr(param(p, "h1", "kernel"), "update", "lazy"),
     "kernel 'h1' (dense): param 'h1/kernel': unknown update 'lazy'; the CS system has dense, "
     "sparse"),
    (lambda p: setattr(param(p, "h1", "kernel"), "update", "sparse"),
     "kernel 'h1' (dense): param 'h1/kernel': a sparse update needs the table of a gather kernel"),
    (lambda p: param(p, "h2", "bias").regularizers.add(kind="l3", scale=0.1),
     "kernel 'h2' (dense): param 'h2/bias': unknown regularizer 'l3'; the CS system has l2, l1"),
    (lambda p: param(p, "h2", "bias").regularizers.add(kind="l2", scale=float("nan")),
     "param 'h2/bias': regularizer l2 has scale nan"),
    (lambda p: setattr(param(p, "h2", "bias"), "variable", "h1/kernel"),
     "kernel 'h2': variable 'h1/kernel' is (8,) here, (12, 16) in an earlier kernel"),
    (lambda p: p.gradient_transforms.add(kind="clip_by_norm", value=1.0, variables=["h3/kernel"]),
     "gradient transform 0 (clip_by_norm): 'h3/kernel' is not a variable of the program"),
    (lambda p: (setattr(param(p, "h1", "bias"), "frozen", True),
                p.gradient_transforms.add(kind="scale", value=2.0, variables=["h1/bias"])),
     "gradient transform 0 (scale): 'h1/bias' is frozen (not trained): it has no gradient"),
    (lambda p: p.gradient_transforms.add(kind="clip_by_global_norm", value=-1.0,
                                         variables=["h1/bias"]),
     "gradient transform 0 (clip_by_global_norm): clip_by_global_norm needs a finite clip "
     "norm > 0"),
    (lambda p: p.gradient_transforms.add(kind="program", variables=["h1/kernel"],
                                         program=centralization("h1/kernel", [12, 16], "h1/mask")),
     "gradient transform 0 (program): it reads 'h1/mask', not a variable of the program"),
    (lambda p: p.gradient_transforms.add(kind="program", variables=["h1/bias"],
                                         program=centralization("h1/kernel", [12, 16])),
     "gradient transform 0 (program): the program of h1/bias's gradient must read it"),
    (lambda p: p.gradient_transforms.add(kind="clip_by_value", variables=[]),
     "gradient transform 0 (clip_by_value): gradient transform clip_by_value names no variables"),
    (lambda p: p.optimizer.CopyFrom(pb.Optimizer(type="adagrad", learning_rate=0.1)),
     "program 'mlp': optimizer adagrad: initial_accumulator_value must be > 0 (as in TF), got 0.0"),
    (lambda p: p.dynamic_loss_scale.CopyFrom(pb.DynamicLossScale(
        scale_variable="current_loss_scale", good_steps_variable="good_steps",
        increment_period=3, multiplier=1.0)),
     "program 'mlp': dynamic loss scale: multiplier must be a finite number above 1, got 1.0"),
    (lambda p: p.dynamic_loss_scale.CopyFrom(pb.DynamicLossScale(
        scale_variable="s", good_steps_variable="s", increment_period=3, multiplier=2.0)),
     "dynamic loss scale: needs two distinct variables"),
    (lambda p: p.cs1_dynamic_loss_scale.CopyFrom(pb.CS1DynamicLossScale(
        scale_variable="s", steps_variable="n", overflows_variable="o", increment_period=3,
        min_scale=4.0, max_scale=2.0, overflow_tolerance=0.05)),
     "dynamic loss scale: the scale's bounds must satisfy 0 < min <= max <= float32's largest, "
     "got [4, 2]"),
    (lambda p: p.cs1_dynamic_loss_scale.CopyFrom(pb.CS1DynamicLossScale(
        scale_variable="s", steps_variable="n", overflows_variable="o", increment_period=3,
        min_scale=1.0, max_scale=2.0, overflow_tolerance=1.0)),
     "dynamic loss scale: overflow_tolerance must be in [0, 1), got 1"),
    (lambda p: setattr(p, "step_counts_applied", True),
     "program 'mlp': step_counts_applied without a dynamic loss scale"),
    (lambda p: p.optimizer.CopyFrom(pb.Optimizer(type="adagrad_da", learning_rate=0.1)),
     "program 'mlp': unknown optimizer 'adagrad_da'; the CS system has sgd, momentum, adam, "
     "rmsprop, adagrad"),
])
def test_bad_programs_are_refused_precisely(edit, message):
    assert message in refusal(edited(edit))


def test_slots_of_the_programs_optimizer_are_checked_by_their_tf_names():
    program = mlp_program(pb.Optimizer(type="rmsprop", learning_rate=0.1, decay=0.9, centered=True))
    weights = mlp_weights()
    ok = {**weights, "h1/kernel/RMSProp_2": np.zeros((FEATURES, 16), F32)}
    check_state(check_program(program), ok)
    assert "tensor 'h1/kernel/Adam' (12, 16) is not a weight or optimizer slot" in refusal(
        program, {**weights, "h1/kernel/Adam": np.zeros((FEATURES, 16), F32)})
    assert "tensor 'h1/kernel/RMSProp_1' is (3,), the program needs (12, 16)" in refusal(
        program, {**weights, "h1/kernel/RMSProp_1": np.zeros(3, F32)})


# ---- embedding tables: TF's sparse (IndexedSlices) rules through the pipeline ----
VOCAB, WIDTH, IDS = 40, 6, 5


def embedding_program(optimizer: pb.Optimizer, update: str) -> pb.Program:
    """ids (5,) -> embedding lookup (40 x 6 table) -> flatten -> dense -> mean sparse
    softmax cross-entropy."""
    p = pb.Program(name="embedding", fabric="cs1", batch_size=BATCH, micro_batch_size=MICRO,
                   loss_kernel="loss", seed=1, optimizer=optimizer)
    p.inputs.add(name="features", dtype=pb.INT32, shape=[IDS])
    p.inputs.add(name="labels", dtype=pb.INT32, shape=[])
    g = p.kernels.add(name="lookup", type="gather", inputs=["features"],
                      output_shape=[IDS, WIDTH], region=REGION)
    g.attrs["operands"].s = "pi"
    g.attrs["p0"].ints.values.extend([VOCAB, WIDTH])
    g.params.add(role="p0", variable="emb", shape=[VOCAB, WIDTH], dtype=pb.FLOAT32, update=update)
    r = p.kernels.add(name="flat", type="reshape", inputs=["lookup"], output_shape=[IDS * WIDTH],
                      region=REGION)
    r.attrs["shape"].ints.values.append(IDS * WIDTH)
    k = p.kernels.add(name="logits", type="dense", inputs=["flat"], output_shape=[5], region=REGION)
    k.attrs["units"].i, k.attrs["use_bias"].b, k.attrs["activation"].s = 5, True, "linear"
    k.params.add(role="kernel", variable="logits/kernel", shape=[IDS * WIDTH, 5], dtype=pb.FLOAT32)
    k.params.add(role="bias", variable="logits/bias", shape=[5], dtype=pb.FLOAT32)
    add_loss(p, "logits")
    return p


def embedding_case(make_tf_optimizer, steps: int = 4):
    rng = np.random.default_rng(3)
    weights = {"emb": rng.normal(size=(VOCAB, WIDTH)).astype(F32),
               "logits/kernel": rng.normal(size=(IDS * WIDTH, 5)).astype(F32) * F32(0.3),
               "logits/bias": np.zeros(5, F32)}
    # batch k looks up rows 4k to 4k + 7, repeating within and across samples: rows of
    # one batch are absent from the next but one, rows from 4 * (steps + 1) on never appear
    batches = [{"features": rng.integers(4 * k, 4 * k + 8, (BATCH, IDS)).astype(np.int32),
                "labels": rng.integers(0, 5, BATCH).astype(np.int32)} for k in range(steps)]
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int32, (None, IDS))
        y = tf.compat.v1.placeholder(tf.int32, (None,))
        v = {n: tf.compat.v1.get_variable(n, initializer=w) for n, w in weights.items()}
        h = tf.reshape(tf.nn.embedding_lookup(v["emb"], ids), (-1, IDS * WIDTH))
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
            y, tf.matmul(h, v["logits/kernel"]) + v["logits/bias"])
        train = make_tf_optimizer().minimize(loss)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            losses = [float(session.run([loss, train], {ids: b["features"], y: b["labels"]})[0])
                      for b in batches]
            state = {x.op.name: session.run(x) for x in tf.compat.v1.global_variables()}
    return weights, batches, (losses, state)


SPARSE_CASES = {
    "momentum": (pb.Optimizer(type="momentum", learning_rate=0.5, momentum=0.9, use_nesterov=True),
                 lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9, use_nesterov=True)),
    "rmsprop": (pb.Optimizer(type="rmsprop", learning_rate=0.05, decay=0.9, momentum=0.5,
                             epsilon=1e-6, centered=True),
                lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, 0.9, 0.5, 1e-6, centered=True)),
    "adam": (pb.Optimizer(type="adam", learning_rate=0.05, beta1=0.9, beta2=0.999, epsilon=1e-8),
             lambda: tf.compat.v1.train.AdamOptimizer(0.05)),
    "adagrad": (pb.Optimizer(type="adagrad", learning_rate=0.5, initial_accumulator_value=0.1),
                lambda: tf.compat.v1.train.AdagradOptimizer(0.5)),
    "sgd": (pb.Optimizer(type="sgd", learning_rate=0.5),
            lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5)),
}


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_embedding_tables_train_by_tfs_sparse_rules(case):
    """Only the looked-up rows (and, for v1 Adam, every row) move, as TF's sparse rules
    move them; the dense rule would move the other rows too (momentum, RMSProp)."""
    optimizer, tf_optimizer = SPARSE_CASES[case]
    weights, batches, reference = embedding_case(tf_optimizer)
    cs = cs_train(embedding_program(optimizer, "sparse"), weights, batches)
    assert_matches_tf(cs, reference, [n for n in reference[1]])
    untouched = slice(4 * (len(batches) + 1), None)
    if case != "adam":
        np.testing.assert_array_equal(cs[1]["emb"][untouched], weights["emb"][untouched])
    if case in ("momentum", "rmsprop"):
        dense = cs_train(embedding_program(optimizer, "dense"), weights, batches)
        assert not np.allclose(dense[1]["emb"], reference[1]["emb"], rtol=1e-3)
