"""Probabilistic and likelihood-based models written the ordinary way (issue 21,
tests/probabilistic_models.py) train 4 steps as TensorFlow trains them (1e-5), two evaluate
(one predicts) on the CS as the CPU path does: one of each special function in the fast lane (a negative
binomial's lgamma, a Beta's lbeta, evidential regression, the Dirichlet KL's digamma, a
von Mises' BesselI0e, a binomial's xlogy and xlog1py), the rest of the corpus in the slow lane (the other lgamma and digamma
likelihoods, Poisson (by hand and Keras'), MDN, Gaussian and heteroscedastic NLL, VAE with TF's draws, focal,
Tweedie, ordinal, quantile, expectile); what stays out is refused in one line naming the op
and its line."""
import cs_inprocess
import probabilistic_models as m
import pytest

from common.errors import CSRunError

BASE = {"runconfig": {"tf_random_seed": 2}}
ONE_OF_EACH = ["negative_binomial", "beta", "evidential", "dirichlet_kl", "von_mises", "binomial"]
EVALUATED = {"evidential", "dirichlet_kl"}
PREDICTED = {"evidential"}


def _trains_like_tensorflow(name: str, tmp_path) -> None:
    model_fn, extra = m.CORPUS[name]
    params = {**BASE, **extra}
    compare = cs_inprocess.compare_drawn if name == "vae" else cs_inprocess.compare
    result = compare(model_fn, m.input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    if name in EVALUATED:
        assert cs_inprocess.evaluation_mismatch(model_fn, m.input_fn, params, str(tmp_path),
                                                result) == ""
    if name in PREDICTED:
        assert cs_inprocess.prediction_mismatch(model_fn, m.input_fn, params,
                                                str(tmp_path / "infer"), result) == ""


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_a_likelihood_with_special_functions_trains_like_tensorflow(tmp_path, name):
    _trains_like_tensorflow(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(m.CORPUS) - set(ONE_OF_EACH)))
def test_the_rest_of_the_corpus_trains_like_tensorflow(tmp_path, name):
    _trains_like_tensorflow(name, tmp_path)


@pytest.mark.parametrize("name", sorted(m.REFUSED))
def test_what_stays_out_is_refused_in_one_line_naming_the_op(tmp_path, name):
    model_fn, extra, op = m.REFUSED[name]
    params = {**BASE, **extra}
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(model_fn, m.input_fn, params, str(tmp_path))
    words = cs_inprocess.model_op_words(model_fn, m.input_fn, params)
    assert cs_inprocess.refusal_problem(caught.value, m.__file__, words) == ""
    assert f"{op} '" in caught.value.message
