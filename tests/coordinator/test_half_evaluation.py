"""The blind testers' mixed_float16 models evaluated and predicted on the CS against the CPU
path from the same checkpoint (docs/design.md, "Mixed precision"): the float16 softmax of
Keras MultiHeadAttention is now TF's bit for bit; TF's Eigen float16 Einsum and
Conv2DBackpropInput (Conv2DTranspose) sum in float16 where the CS sums in float32, so these
models' float16 values stay float16 noise from TF's: metrics to 1e-2 (the mixed rule)."""
from __future__ import annotations

import cs_inprocess
import half_eval_models as m
import numpy as np

MIXED_RTOL = 1e-2  # float16 noise past TF's Eigen float16 Einsum / Conv2DBackpropInput
HALF_ULP = 2.0 ** -10  # float16's spacing at 1


def test_the_fcn_segmenter_evaluates_and_predicts_like_the_cpu_path(tmp_path):
    """unseen26's FCN (three float16 Conv2DTranspose): mean IoU, pixel accuracy and loss as
    the CPU path's; the probabilities within HALF_ULP, a float16 ULP of a unit logit
    (measured 8.5e-5 and 1.3e-4 in two runs), and a pixel's class
    differs only where the CPU path's two likeliest classes are closer than the two paths'
    probabilities (measured: 7 of 16,384 pixels, each a tie within 1.6e-5)."""
    model_dir = str(tmp_path)
    trained = cs_inprocess.compare(m.fcn_segmentation, m.fcn_input_fn, m.fcn_params, model_dir, steps=1)
    problem = cs_inprocess.evaluation_mismatch(m.fcn_segmentation, m.fcn_input_fn, m.fcn_params,
                                               model_dir, trained, rtol=MIXED_RTOL)
    assert not problem, problem
    cs, cpu = cs_inprocess.both_predictions(m.fcn_segmentation, m.fcn_input_fn, m.fcn_params,
                                            model_dir, trained)
    apart = np.abs(cs["probabilities"] - cpu["probabilities"]).max(-1)
    assert apart.max() < HALF_ULP
    likeliest = np.sort(cpu["probabilities"], -1)
    gap = likeliest[..., -1] - likeliest[..., -2]
    differ = cs["classes"] != cpu["classes"]
    assert (gap[differ] <= 2 * apart[differ]).all() and differ.mean() < 1e-3


def test_the_seq2seq_transformer_evaluates_and_predicts_like_the_cpu_path(tmp_path):
    """unseen25's Transformer (Keras MultiHeadAttention in float16: softmax TF's bit for bit,
    Einsum float32-summed): loss and token accuracy as the CPU path's, the same tokens."""
    model_dir = str(tmp_path)
    trained = cs_inprocess.compare(m.transformer_seq2seq, m.seq2seq_input_fn, m.seq2seq_params,
                                   model_dir, steps=1)
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(m.transformer_seq2seq, m.seq2seq_input_fn, m.seq2seq_params, model_dir, trained,
                        rtol=MIXED_RTOL)
        assert not problem, problem
