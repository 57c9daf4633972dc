"""Gradients that are 0 in exact arithmetic, found by blind testers (unseen25): a Conformer's
Keras MultiHeadAttention with dropout (TF's masks handed to the CS: compare_drawn) computes its scores by a batch matmul (BatchMatMulV2),
through which the shift proof (coordinator/compiler/training/shift.py) follows the key bias
to the softmax: the CS applies the exact 0 instead of refusing the bias as a batch
normalization's noise, and trains the rest like TensorFlow."""
from __future__ import annotations

import cs_inprocess
import exact_zero_models as models


def test_conformer_key_bias_gets_the_exact_zero_and_the_rest_trains_like_tensorflow(tmp_path):
    result = cs_inprocess.compare_drawn(models.conformer, models.conformer_input_fn,
                                        dict(models.CONFORMER_PARAMS), str(tmp_path), steps=4)
    assert "mhsa/key/bias" in cs_inprocess.zero_gradient_variables(result.compiled)
    assert cs_inprocess.mismatches(result) == []
