"""Small dense linear systems (tests/linalg_models.py): a sparse variational GP's Cholesky
factor and its inverse computed from weights (tf.linalg.cholesky, triangular_solve,
cholesky_solve) and a Lagrangian network's per-sample tf.linalg.solve (or inv) of its
Hessian block, and per-sample determinants (tf.linalg.det, slogdet) train on the CS as
TensorFlow trains them (4 steps, 1e-5) and evaluate and predict there as the CPU path does;
per-sample eigenvalues stay refused in one line."""
import cs_inprocess
import flow_models
import linalg_models as m
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 3}}


@pytest.mark.parametrize("model_fn, input_fn, params, kernels", [
    (m.svgp, m.gp_input_fn, {}, {"cholesky", "solve"}),
    (m.svgp, m.gp_input_fn, {"whitened": False}, {"cholesky", "solve"}),
    (m.lagrangian, m.pendulum_input_fn, {}, {"solve"}),
    pytest.param(m.lagrangian, m.pendulum_input_fn, {"inverse": True}, {"solve"},
                 marks=pytest.mark.slow),  # (~7 s; inv is the solve kernel tested above)
    (m.per_sample_determinant, m.pendulum_input_fn, {}, {"slogdet"}),
    (flow_models.per_sample_log_det, flow_models.density_input_fn, {}, {"slogdet"}),
], ids=["svgp_whitened", "svgp_cholesky_solve", "lagrangian_solve", "lagrangian_inverse",
        "determinant", "log_determinant"])
def test_a_model_solving_linear_systems_trains_evaluates_and_predicts_like_tensorflow(
        tmp_path, model_fn, input_fn, params, kernels):
    params = {**PARAMS, **params}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert kernels <= cs_inprocess.kernel_types(result.compiled.program)
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, params, str(tmp_path), result) == []


def test_the_eigenvalues_of_each_samples_matrix_are_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(m.per_sample_eigenvalues, m.pendulum_input_fn, PARAMS,
                                   str(tmp_path), m.__file__)
    line = next(n for n, text in enumerate(open(m.__file__), 1) if "tf.linalg.eigvalsh(" in text)
    assert "SelfAdjointEigV2" in message and f"linalg_models.py:{line}" in message
