"""Images rotated and flipped by a constant (tests/rotated_image_models.py): tf.image.rot90(x, k)
of a Python k builds tf.conds on k % 4, constant when the graph builds; the compiler builds
each taken branch alone (constant_conds.py), the transpose and reverse the rotation is.
Proven here: a classifier pooling one convolution over the four rotations and the mirror
image, and RotNet with its rotations stacked sample-major and folded into the batch, train
4 steps as TF does and evaluate and predict like the CPU path; RotNet's rotations
concatenated along the batch stay refused in one line that names the form that trains."""
from __future__ import annotations

import cs_inprocess
import pytest
import rotated_image_models as m

PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 3}}
CASES = {"rotation_pooled": m.rotation_pooled, "rotnet_stacked": m.rotnet_stacked}


@pytest.mark.parametrize("name", sorted(CASES))
def test_images_rotated_by_a_constant_train_and_evaluate_like_tensorflow(tmp_path, name):
    model_fn = CASES[name]
    result = cs_inprocess.compare(model_fn, m.images_input_fn, PARAMS, str(tmp_path), steps=4)
    assert not {"if", "cond"} & cs_inprocess.kernel_types(result.compiled.program)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    assert cs_inprocess.cpu_path_mismatches(model_fn, m.images_input_fn, PARAMS,
                                            str(tmp_path), result) == []


def test_rotations_concatenated_along_the_batch_are_refused_naming_the_stacked_form(tmp_path):
    message = cs_inprocess.refusal(m.rotnet_concatenated, m.images_input_fn, PARAMS,
                                   str(tmp_path), m.__file__)
    assert "ConcatV2" in message and "StatelessIf" not in message
    assert "tf.stack(parts, axis=1)" in message and "tf.tile(tf.range(4), [B])" in message
