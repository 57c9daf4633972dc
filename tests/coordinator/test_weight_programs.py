"""Computations on weights before they meet the samples (issue 21): a cosine classifier,
weight normalization, a learned temperature, a softplus scale, a masked transposed kernel,
a low-rank kernel, a weight-standardised convolution, a normalised embedding table and a
soft decision tree's leaf distributions (tf.nn.softmax of a weight) train on the CS as TensorFlow trains them (the weight program: forward once a step, its
gradient taken back through the same kernels), evaluate and predict there with the CPU
path's numbers, and are charged once a step in the timing model; every op it runs computes
TF's values and gradients; an op the CS cannot run on a weight is refused in one line
naming it and its source line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import weight_program_models as m

from common.errors import CSRunError
from coordinator.compiler.lowering import WEIGHT_PROGRAM_OPS
from coordinator.compiler.operands import Operands, Weight
from coordinator.compiler.weight_program import WeightProgramBuilder
from cs_api import pb
from wafer import timing
from wafer.kernels import build_kernel
from wafer.weight_programs import WeightProgram, WeightStep
from wse_sim.errors import CSError
from wse_sim.program import check_program

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "cosine_classifier": (m.cosine_classifier, m.input_fn, {}),
    "weight_normalization": (m.weight_normalization, m.input_fn, {"optimizer": "adam"}),
    "learned_temperature": (m.learned_temperature, m.input_fn, {"optimizer": "adam"}),
    "positive_scale_and_mask": (m.positive_scale_and_mask, m.input_fn, {"optimizer": "momentum"}),
    "low_rank_kernel": (m.low_rank_kernel, m.input_fn, {}),
    "normalized_embedding": (m.normalized_embedding, m.token_input_fn, {"optimizer": "adam"}),
    "standardized_conv": (m.standardized_conv, m.image_input_fn, {"optimizer": "adam"}),
    "soft_decision_tree": (m.soft_decision_tree, m.input_fn, {"optimizer": "adam"}),
    "sincnet": (m.sincnet, m.audio_input_fn, {"optimizer": "adam", "learning_rate": 0.01}),
}
# each model's weights the weight program reads, and a value it computes
SOURCES = {"cosine_classifier": ({"w"}, "l2_normalize_1"),
           "weight_normalization": ({"g", "v"}, "truediv"),
           "learned_temperature": ({"log_temperature"}, "Exp"),
           "positive_scale_and_mask": ({"kernel", "scale"}, "Softplus"),
           "low_rank_kernel": ({"u", "v"}, "MatMul"),
           "normalized_embedding": ({"table"}, "l2_normalize"),
           "standardized_conv": ({"filters"}, "mul"),
           "soft_decision_tree": ({"leaf_logits"}, "Softmax"),
           "sincnet": ({"low_hz", "band_hz"}, "SelectV2_1")}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


@pytest.mark.parametrize("name", CASES)
def test_models_computing_on_weights_train_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    program = result.compiled.program.weight_program
    sources, value = SOURCES[name]
    assert {p.variable for p in program.sources} == sources
    assert value in {k.name for k in program.kernels}
    # the sources are the CS's state, trained; what it computes from them is not state
    assert sources <= set(result.cs.state) and value not in result.cs.state
    assert all(not (result.cs.state[v] == result.compiled.initial_weights[v]).all()
               for v in sources)


def test_a_cosine_classifier_evaluates_on_the_cs_with_the_cpu_paths_metrics(compared, tmp_path):
    params = {**BASE, **CASES["cosine_classifier"][2]}
    assert cs_inprocess.evaluation_mismatch(m.cosine_classifier, m.input_fn, params,
                                            str(tmp_path), compared("cosine_classifier")) == ""


def test_a_soft_decision_tree_evaluates_on_the_cs_with_the_cpu_paths_metrics(compared,
                                                                               tmp_path):
    params = {**BASE, **CASES["soft_decision_tree"][2]}
    assert cs_inprocess.evaluation_mismatch(m.soft_decision_tree, m.input_fn, params,
                                            str(tmp_path), compared("soft_decision_tree")) == ""


def test_sincnet_evaluates_on_the_cs_with_the_cpu_paths_metrics(compared, tmp_path):
    params = {**BASE, **CASES["sincnet"][2]}
    assert cs_inprocess.evaluation_mismatch(m.sincnet, m.audio_input_fn, params, str(tmp_path),
                                            compared("sincnet")) == ""


def test_a_learned_temperature_predicts_on_the_cs_what_the_cpu_path_predicts(compared, tmp_path):
    params = {**BASE, **CASES["learned_temperature"][2]}
    assert cs_inprocess.prediction_mismatch(m.learned_temperature, m.input_fn, params,
                                            str(tmp_path), compared("learned_temperature")) == ""


def test_the_weight_program_is_in_the_report_and_charged_once_a_step(compared):
    compiled = compared("cosine_classifier").compiled
    report, program = compiled.report_text, compiled.program
    assert "Weight program (computed from w before every batch" in report
    assert "  l2_normalize_1 = mul(w, l2_normalize_1/Rsqrt) (16, 4), read by MatMul" in report
    t, steps, fabric = cs_inprocess.weight_program_timing(program)
    reader = next(k for k in program.kernels if any(p.variable == "l2_normalize_1" for p in k.params))
    assert all(k.region == reader.region for k in program.weight_program.kernels)
    cores = reader.region.width * reader.region.height
    expected = sum(timing.TRAIN_FLOPS_FACTOR * s.kernel.flops_per_sample()
                   / (min(cores, s.kernel.max_cores()) * fabric.core_flops_per_sec) for s in steps)
    assert t.weight_program_seconds == pytest.approx(expected) and expected > 0
    assert t.step_seconds(8) == pytest.approx(
        7 / t.samples_per_sec + t.fill_seconds + t.update_seconds + expected)
    assert f"weight program {1e6 * expected:.3f} us" in report


def test_a_recurrence_unrolled_in_python_compiles_in_seconds_and_trains_like_tensorflow(tmp_path):
    """Each step of the Kalman filter reuses its covariance's entries several times: a walk
    over the weight program's paths (not its values) took minutes at 10 steps, days at 16."""
    result = cs_inprocess.compare(m.kalman_filter, m.track_input_fn, BASE, str(tmp_path), steps=2)
    cs_inprocess.assert_same_training(result)
    assert result.cs.losses[0] != result.cs.losses[-1]
    assert {p.variable for p in result.compiled.program.weight_program.sources} == {"raw_q", "raw_r"}


def test_an_op_the_cs_cannot_run_on_a_weight_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(m.cumulative_kernel, m.input_fn, BASE, str(tmp_path))
    assert "computes on weights with Cumprod 'Cumprod' at" in str(refused.value)
    assert cs_inprocess.refusal_problem(refused.value, m.__file__, cs_inprocess.model_op_words(
        m.cumulative_kernel, m.input_fn, BASE)) == ""


def test_a_row_selection_of_a_weight_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(m.row_selected_kernel, m.input_fn, BASE, str(tmp_path))
    assert "with Select 'Select' at" in str(refused.value)
    assert "selects whole rows: use tf.where" in str(refused.value)
    assert cs_inprocess.refusal_problem(refused.value, m.__file__, cs_inprocess.model_op_words(
        m.row_selected_kernel, m.input_fn, BASE)) == ""


def test_the_cs_refuses_a_weight_program_it_cannot_run(compared):
    good = compared("learned_temperature").compiled.program
    for change, words in [(lambda p: p.weight_program.kernels[0].inputs.__setitem__(0, "nope"),
                           "inputs among its sources"),
                          (lambda p: p.weight_program.kernels[0].output_shape.append(2),
                           "computes a float32 ()"),
                          (lambda p: setattr(p.weight_program.sources[0], "update", "sparse"),
                           "sparse update")]:
        bad = pb.Program()
        bad.CopyFrom(good)
        change(bad)
        with pytest.raises(CSError, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_program(bad)


# One expression per op the weight program runs, over weights w, v (3, 4; positive), g
# (4,) and s (3, 1): the builder's kernels must compute TF's values and TF's gradients.
EXPRESSIONS = {
    "Abs": lambda w, v, g, s: tf.abs(w - 1.0), "Cos": lambda w, v, g, s: tf.cos(w),
    "Elu": lambda w, v, g, s: tf.nn.elu(w - 1.0), "Erf": lambda w, v, g, s: tf.math.erf(w),
    "Erfc": lambda w, v, g, s: tf.math.erfc(w), "Exp": lambda w, v, g, s: tf.exp(w),
    "Expm1": lambda w, v, g, s: tf.math.expm1(w), "Inv": lambda w, v, g, s: tf.raw_ops.Inv(x=w),
    "LeakyRelu": lambda w, v, g, s: tf.nn.leaky_relu(w - 1.0, 0.3),
    "Log": lambda w, v, g, s: tf.math.log(w), "Log1p": lambda w, v, g, s: tf.math.log1p(w),
    "Neg": lambda w, v, g, s: -w, "Reciprocal": lambda w, v, g, s: tf.math.reciprocal(w),
    "Relu": lambda w, v, g, s: tf.nn.relu(w - 1.0), "Relu6": lambda w, v, g, s: tf.nn.relu6(w * 4.0),
    "Rsqrt": lambda w, v, g, s: tf.math.rsqrt(w), "Selu": lambda w, v, g, s: tf.nn.selu(w - 1.0),
    "Sigmoid": lambda w, v, g, s: tf.sigmoid(w), "Sign": lambda w, v, g, s: tf.sign(w - 1.0),
    "Sin": lambda w, v, g, s: tf.sin(w), "Softplus": lambda w, v, g, s: tf.nn.softplus(w),
    "Tan": lambda w, v, g, s: tf.math.tan(0.5 * w), "Asin": lambda w, v, g, s: tf.math.asin(0.3 * w),
    "Acos": lambda w, v, g, s: tf.math.acos(0.3 * w - 0.2), "Atan": lambda w, v, g, s: tf.math.atan(w - 1.0),
    "Atan2": lambda w, v, g, s: tf.math.atan2(w - 1.0, v),
    "Softsign": lambda w, v, g, s: tf.nn.softsign(w), "Sqrt": lambda w, v, g, s: tf.sqrt(w),
    "Square": lambda w, v, g, s: tf.square(w), "Tanh": lambda w, v, g, s: tf.tanh(w),
    "Lgamma": lambda w, v, g, s: tf.math.lgamma(w), "Digamma": lambda w, v, g, s: tf.math.digamma(w),
    "BesselI0e": lambda w, v, g, s: tf.math.bessel_i0e(w),
    "Xlogy": lambda w, v, g, s: tf.math.xlogy(w - 1.0, v), "Xlog1py": lambda w, v, g, s: tf.math.xlog1py(v, w),
    "Add": lambda w, v, g, s: tf.raw_ops.Add(x=w, y=v), "AddV2": lambda w, v, g, s: w + g,
    "BiasAdd": lambda w, v, g, s: tf.nn.bias_add(w, g), "Div": lambda w, v, g, s: tf.raw_ops.Div(x=w, y=v),
    "Maximum": lambda w, v, g, s: tf.maximum(w, v), "Minimum": lambda w, v, g, s: tf.minimum(w, 1.0),
    "Mul": lambda w, v, g, s: g * w * s, "Pow": lambda w, v, g, s: tf.pow(w, v),
    "RealDiv": lambda w, v, g, s: 2.0 / w, "SquaredDifference": lambda w, v, g, s: tf.math.squared_difference(w, v),
    "Sub": lambda w, v, g, s: 2.0 - w, "AddN": lambda w, v, g, s: tf.add_n([w, v, w]),
    "Max": lambda w, v, g, s: tf.reduce_max(w, 0), "Mean": lambda w, v, g, s: tf.reduce_mean(w, 1, keepdims=True),
    "Min": lambda w, v, g, s: tf.reduce_min(w * v), "Sum": lambda w, v, g, s: tf.reduce_sum(w * w, [0, 1]),
    "Reshape": lambda w, v, g, s: tf.reshape(w * v, [2, 6]), "Squeeze": lambda w, v, g, s: tf.squeeze(s * 2.0),
    "ExpandDims": lambda w, v, g, s: tf.expand_dims(w * v, 1), "Transpose": lambda w, v, g, s: tf.transpose(w * v),
    "MatMul": lambda w, v, g, s: tf.matmul(w, v, transpose_b=True),
    # a Gram matrix of feature maps [1, HW, C], tf.matmul(f, f, transpose_a=True)
    "BatchMatMulV2": lambda w, v, g, s: tf.matmul(tf.reshape(w, [1, 3, 4]), tf.reshape(v * s, [1, 3, 4]),
                                                  transpose_a=True),
    "BatchMatMulV3": lambda w, v, g, s: tf.raw_ops.BatchMatMulV3(
        x=tf.reshape(w, [2, 3, 2]), y=tf.reshape(v - g, [2, 3, 2]), Tout=tf.float32, adj_y=True),
    # a frozen loss network's layers on a constant image, and on a value of weights
    "Conv2D": lambda w, v, g, s: tf.nn.conv2d(tf.reshape(v * s, [1, 3, 4, 1]), tf.reshape(
        w, [2, 2, 1, 3]), 1, "SAME") + tf.nn.conv2d(tf.constant(np.arange(24.0, dtype=np.float32).reshape(
            1, 4, 3, 2) / 7.0), tf.reshape(w, [2, 1, 2, 3]), [1, 2], "VALID")[:, :3, :1],
    "MaxPool": lambda w, v, g, s: tf.nn.max_pool2d(tf.reshape(w * v, [1, 3, 4, 1]), 2, 1, "VALID"),
    "AvgPool": lambda w, v, g, s: tf.nn.avg_pool2d(tf.reshape(w - v, [1, 3, 4, 1]), 2, [1, 2], "SAME"),
    "Einsum": lambda w, v, g, s: tf.einsum("ij,kj->ik", w, v) + tf.einsum(
        "qn,kn->qk", np.arange(12, dtype=np.float32).reshape(3, 4) / 7, w),
    "StopGradient": lambda w, v, g, s: tf.stop_gradient(w) * v,
    "StridedSlice": lambda w, v, g, s: (w * v)[::-2, tf.newaxis, 1:-1],
    "Slice": lambda w, v, g, s: tf.slice(w * v, [1, 0], [-1, 3]),
    "Split": lambda w, v, g, s: tf.split(w * v, 2, axis=1)[1],
    "SplitV": lambda w, v, g, s: tf.split(w * v, [1, 3], axis=1)[1] * 2.0,
    "Unpack": lambda w, v, g, s: tf.unstack(w * v)[2],
    "GatherV2": lambda w, v, g, s: tf.gather(w * v, [[3, 0], [3, 3]], axis=-1),
    "ResourceGather": lambda w, v, g, s: tf.gather(w, [2, 0, 2]) * v,
    "ConcatV2": lambda w, v, g, s: tf.concat([w, v * 2.0, s, w], axis=-1),
    "Pack": lambda w, v, g, s: tf.stack([w, v * 2.0, w], axis=1),
    "ReverseV2": lambda w, v, g, s: tf.reverse(w * v, [1, 0]),  # (a mirrored filter's half)
    "Floor": lambda w, v, g, s: tf.floor(w * 3.0) * v, "Ceil": lambda w, v, g, s: tf.math.ceil(w * 3.0) * v,
    "Round": lambda w, v, g, s: tf.round(w * 3.0) * v, "Rint": lambda w, v, g, s: tf.math.rint(w * 3.0) * v,
    "FloorDiv": lambda w, v, g, s: tf.math.floordiv(w * 3.0, v) * v,
    "FloorMod": lambda w, v, g, s: tf.math.floormod(w * 3.0, v),
    "DivNoNan": lambda w, v, g, s: tf.math.divide_no_nan(w, tf.nn.relu(v - 1.0)),
    "Cumsum": lambda w, v, g, s: tf.cumsum(w * v, axis=1, reverse=True),
    "Softmax": lambda w, v, g, s: tf.nn.softmax(w * v),
    "LogSoftmax": lambda w, v, g, s: tf.nn.log_softmax(w - g, axis=0),
    "L2Loss": lambda w, v, g, s: tf.nn.l2_loss(w * v),
    "Prod": lambda w, v, g, s: tf.reduce_prod(w, 0),
    "Greater": lambda w, v, g, s: tf.where(w > v, w, -v),
    "GreaterEqual": lambda w, v, g, s: tf.where(w >= 1.0, w * v, g),
    "Less": lambda w, v, g, s: tf.where(w < s + 1.0, w, 0.0),
    "LessEqual": lambda w, v, g, s: tf.where(tf.less_equal(w, v), 1.0, w),
    "Equal": lambda w, v, g, s: tf.where(tf.equal(tf.floor(w * 2.0), 2.0), w, v),
    "NotEqual": lambda w, v, g, s: tf.where(tf.not_equal(tf.sign(s), 1.0), w * v, w),
    "Select": lambda w, v, g, s: tf.compat.v1.where(
        tf.constant([[True, False, True, False]] * 3), w, v * 2.0),
    # sinc of 0 in the unchosen branch: TF's gradient is nan there, and so is the CS's
    "SelectV2": lambda w, v, g, s: tf.where(tf.equal(w * [[0.0], [1.0], [1.0]], 0.0), 1.0,
                                            tf.sin(w * [[0.0], [1.0], [1.0]]) / (w * [[0.0], [1.0], [1.0]])),
    "Cast": lambda w, v, g, s: w * tf.cast(tf.abs(w - 1.0) > 0.3, tf.float32),  # (SINDy's mask)
    "MatrixDiagV3": lambda w, v, g, s: tf.linalg.diag(w * v),
    "MatrixDiagPartV3": lambda w, v, g, s: tf.linalg.diag_part(tf.matmul(w, v, transpose_b=True)),
    "MatrixSetDiagV3": lambda w, v, g, s: tf.linalg.set_diag(tf.matmul(w, v, transpose_b=True),
                                                             tf.reshape(s, [3])),
    "MatrixBandPart": lambda w, v, g, s: tf.linalg.band_part(w * v, 1, 0),
    "LogMatrixDeterminant": lambda w, v, g, s: tf.linalg.slogdet(
        tf.matmul(w, v, transpose_b=True) - 4.0 * tf.eye(3))[1] * 2.0,  # (Glow's log|det W|)
    # a sparse GP's factor of its inducing points' kernel matrix and the factor's inverse
    "Cholesky": lambda w, v, g, s: tf.linalg.cholesky(tf.matmul(w, w, transpose_b=True) + tf.eye(3)),
    "MatrixTriangularSolve": lambda w, v, g, s: tf.linalg.triangular_solve(
        tf.matmul(w, v, transpose_b=True), tf.eye(3) + s, lower=False, adjoint=True),
    "MatrixSolve": lambda w, v, g, s: tf.linalg.solve(tf.matmul(w, v, transpose_b=True) - 4.0 * tf.eye(3), s),
    "MatrixInverse": lambda w, v, g, s: tf.linalg.inv(tf.matmul(w, v, transpose_b=True) - 4.0 * tf.eye(3)),
    "MatrixDeterminant": lambda w, v, g, s: tf.linalg.det(tf.matmul(w, v, transpose_b=True) - 4.0 * tf.eye(3)),
    "FakeQuantWithMinMaxArgs": lambda w, v, g, s: tf.quantization.fake_quant_with_min_max_args(
        w - 1.0, -0.4, 0.8, num_bits=4),
    "FakeQuantWithMinMaxVars": lambda w, v, g, s: tf.quantization.fake_quant_with_min_max_vars(
        w * v - 2.0, tf.reduce_min(g), tf.reduce_max(w), num_bits=5, narrow_range=True),
    "FakeQuantWithMinMaxVarsPerChannel": lambda w, v, g, s:
        tf.quantization.fake_quant_with_min_max_vars_per_channel(w - 1.2, -tf.abs(g), tf.abs(g) + 0.1),
}


def test_every_op_of_the_weight_program_computes_tfs_values_and_gradients():
    assert sorted(EXPRESSIONS) == WEIGHT_PROGRAM_OPS
    rng = np.random.default_rng(0)
    values = {"w": rng.uniform(0.5, 2.0, (3, 4)), "v": rng.uniform(0.5, 2.0, (3, 4)),
              "g": rng.normal(size=4), "s": rng.normal(size=(3, 1))}
    graph = tf.Graph()
    with graph.as_default():
        variables = {n: tf.compat.v1.get_variable(n, initializer=a.astype(np.float32))
                     for n, a in values.items()}
        outputs = {op: f(*variables.values()) for op, f in EXPRESSIONS.items()}
        seeds = {op: tf.constant(rng.normal(size=y.shape.as_list()), tf.float32)
                 for op, y in outputs.items()}
        grads = {op: [tf.zeros_like(x) if d is None else tf.convert_to_tensor(d) for x, d in zip(
            variables.values(), tf.gradients(tf.reduce_sum(y * seeds[op]), list(variables.values())))]
            for op, y in outputs.items()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            expected = session.run({op: (y, seeds[op], grads[op]) for op, y in outputs.items()})
        state = {n: a.astype(np.float32) for n, a in values.items()}
        for op, y in outputs.items():
            builder = WeightProgramBuilder(Operands(graph, set()), set())
            derived = builder.derive(y)
            assert isinstance(derived, Weight), f"{op}: {derived}"
            program = builder.program({derived.variable})
            assert program is not None and op in {k.ops and graph.get_operation_by_name(
                k.ops[0]).type for k in program.kernels}
            runtime = WeightProgram([p.variable for p in program.sources], [
                WeightStep(build_kernel(k.type, k.name, k.attrs, k.input_shapes), k.inputs)
                for k in program.kernels])
            value, seed, tf_grads = expected[op]
            np.testing.assert_allclose(runtime.forward(state)[derived.variable], value,
                                       rtol=1e-5, atol=1e-6, err_msg=op)
            ours = runtime.backward({derived.variable: seed})
            for name, tf_grad in zip(variables, tf_grads):
                np.testing.assert_allclose(ours.get(name, np.zeros_like(tf_grad)), tf_grad,
                                           rtol=1e-5, atol=1e-5, err_msg=f"{op}: d/d{name}")
