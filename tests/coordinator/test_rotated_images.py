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
import tf_reference

PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 3}}
CASES = {"rotation_pooled": m.rotation_pooled, "rotnet_stacked": m.rotnet_stacked}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """name -> (model_dir, compare() of 4 steps), each case once."""
    found = {}

    def get(name):
        if name not in found:
            model_dir = str(tmp_path_factory.mktemp(name))
            found[name] = model_dir, cs_inprocess.compare(CASES[name], m.images_input_fn, PARAMS,
                                                          model_dir, steps=4)
        return found[name]
    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_images_rotated_by_a_constant_train_and_evaluate_like_tensorflow(trained, name):
    model_dir, result = trained(name)
    assert not {"if", "cond"} & cs_inprocess.kernel_types(result.compiled.program)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    assert cs_inprocess.cpu_path_mismatches(CASES[name], m.images_input_fn, PARAMS,
                                            model_dir, result) == []


def test_rotnet_stacked_pools_each_rotation_and_labels_each_samples_rows(trained):
    """The folded rotations are pooled as each sample's (4, H, W, C) and each sample's 4 rows
    of the tiled labels are 0..3; at micro-batches of 1 and 2 each sample still reads its
    own rows: TF's training (1e-5)."""
    _, result = trained("rotnet_stacked")
    program = result.compiled.program
    pools = [k for k in program.kernels if k.type == "max_pool"]
    assert [list(k.output_shape) for k in pools] == [[4, 6, 6, 8]]
    labels = [k for k in program.kernels if k.type == "sample_constant"]
    assert len(labels) == 1 and list(labels[0].output_shape) == [4]
    data = tf_reference.batches(m.images_input_fn, PARAMS, 4)
    for micro in (1, 2):
        cs = cs_inprocess.run_on_cs(cs_inprocess.at_micro_batch(program, micro),
                                    result.compiled.initial_weights, data)
        again = cs_inprocess.Comparison(result.compiled, cs, result.reference)
        assert cs_inprocess.mismatches(again, rtol=1e-5) == [], micro


def test_rotations_concatenated_along_the_batch_are_refused_naming_the_stacked_form(tmp_path):
    message = cs_inprocess.refusal(m.rotnet_concatenated, m.images_input_fn, PARAMS,
                                   str(tmp_path), m.__file__)
    assert "ConcatV2" in message and "StatelessIf" not in message
    assert "tf.stack(parts, axis=1)" in message and "tf.tile(tf.range(4), [B])" in message
