"""The blind testers' mixed_float16 models evaluated and predicted on the CS against the CPU
path from the same checkpoint (docs/design.md, "Mixed precision"): the float16 softmax of
Keras MultiHeadAttention is now TF's bit for bit; TF's Eigen float16 Einsum and
Conv2DBackpropInput (Conv2DTranspose) sum in float16 where the CS sums in float32, so those
models' float16 values stay within float16 noise of TF's: metrics to 1e-2, the mixed rule."""
from __future__ import annotations

import cs_inprocess
import half_eval_models as m
import pytest

MIXED_RTOL = 1e-2  # float16 noise past TF's Eigen float16 Einsum / Conv2DBackpropInput


@pytest.mark.parametrize("model_fn, input_fn, params", [
    (m.fcn_segmentation, m.fcn_input_fn, m.fcn_params),
    (m.transformer_seq2seq, m.seq2seq_input_fn, m.seq2seq_params)], ids=["fcn", "seq2seq"])
def test_mixed_float16_models_evaluate_and_predict_like_the_cpu_path(model_fn, input_fn, params, tmp_path):
    trained = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=1)
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(model_fn, input_fn, params, str(tmp_path), trained, rtol=MIXED_RTOL)
        assert not problem, problem
