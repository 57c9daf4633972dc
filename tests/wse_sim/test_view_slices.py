"""The IndexedSlices the CS takes for a table read through the one view of a gather at
constant indices (wse_sim/view_slices.py) are TF's: tf.gather's gradient rows, one per
gathered position, whatever the arrangement (a transpose) the view holds them in; a view
naming part of a row is refused."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from wse_sim.view_slices import view_slices, whole_rows_problem

ROWS, HEADS = 7, 3
INDICES = np.array([[0, 2, 2, 5], [5, 5, 0, 1], [1, 2, 5, 5]])  # rows 3, 4, 6 never named


def _tf_slices(upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TF's IndexedSlices of tf.gather(table, INDICES) transposed to [HEADS, 3, 4], under
    the upstream gradient `upstream` of the transposed value."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        table = tf.compat.v1.get_variable("t", [ROWS, HEADS])
        biased = tf.transpose(tf.gather(table, tf.constant(INDICES)), [2, 0, 1])
        grad = tf.gradients(tf.reduce_sum(biased * upstream), table)[0]
        session.run(tf.compat.v1.global_variables_initializer())
        return session.run([grad.indices, grad.values])


def test_the_views_slices_are_tfs_gather_rows_in_a_transposed_arrangement():
    upstream = np.random.default_rng(0).normal(size=(HEADS, 3, 4)).astype(np.float32)
    view = np.transpose(INDICES[..., None] * HEADS + np.arange(HEADS), [2, 0, 1])
    ids, values = view_slices(view, upstream, (HEADS,))
    tf_ids, tf_values = _tf_slices(upstream)
    assert sorted(ids.tolist()) == sorted(tf_ids.tolist())
    ours = sorted(zip(ids.tolist(), values.tolist()))
    theirs = sorted(zip(tf_ids.tolist(), tf_values.tolist()))
    assert ours == theirs  # each slice one gathered position's row, bit for bit
    assert whole_rows_problem(view, HEADS) == ""


def test_a_view_naming_part_of_a_row_is_refused():
    view = (INDICES[..., None] * HEADS + np.arange(HEADS))[..., :2]
    assert "read whole" in whole_rows_problem(view, HEADS)
