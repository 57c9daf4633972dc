"""tf_model.checkpoints: the one checkpoint writer and index of the CPU path and the chief."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from tf_model.checkpoints import (
    all_checkpoints,
    latest_checkpoint,
    read_checkpoint,
    restore_variables,
    write_checkpoint,
)


def tensors(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    kernel = rng.standard_normal((4, 3)).astype(np.float32)
    return {"dense/kernel": kernel, "dense/bias": np.full(3, step, np.float32),
            "dense/kernel/Adam": kernel * 0.5, "dense/kernel/Adam_1": kernel ** 2,
            "dense/bias/Adam": np.zeros(3, np.float32), "dense/bias/Adam_1": np.ones(3, np.float32),
            "beta1_power": np.float32(0.9 ** step), "beta2_power": np.float32(0.999 ** step),
            "global_step": np.int64(step)}


def test_written_tensors_read_back_exactly_with_names_and_dtypes(tmp_path):
    path = write_checkpoint(str(tmp_path), 7, tensors(7), keep_max=5)
    assert path == str(tmp_path / "model.ckpt-7")
    reader = tf.train.load_checkpoint(path)
    assert reader.get_variable_to_dtype_map()["global_step"] == tf.int64
    back = read_checkpoint(path)
    assert sorted(back) == sorted(tensors(7))
    for name, value in tensors(7).items():
        np.testing.assert_array_equal(back[name], value)
        assert back[name].dtype == np.asarray(value).dtype
    assert tf.train.latest_checkpoint(str(tmp_path)) == path  # TF parses our index


def test_a_graph_saver_restores_what_write_checkpoint_wrote(tmp_path):
    path = write_checkpoint(str(tmp_path), 3, tensors(3), keep_max=None)
    graph = tf.Graph()
    with graph.as_default():
        kernel = tf.compat.v1.get_variable("dense/kernel", (4, 3))
        step = tf.compat.v1.train.get_or_create_global_step()
    session = tf.compat.v1.Session(graph=graph)
    restore_variables(session, [kernel, step], path)
    np.testing.assert_array_equal(session.run(kernel), tensors(3)["dense/kernel"])
    assert session.run(step) == 3


def test_restoring_a_variable_the_checkpoint_lacks_names_it(tmp_path):
    path = write_checkpoint(str(tmp_path), 1, tensors(1), keep_max=None)
    graph = tf.Graph()
    with graph.as_default():
        other = tf.compat.v1.get_variable("conv/kernel", (3, 3))
        wrong = tf.compat.v1.get_variable("dense/kernel", (5, 3))
    session = tf.compat.v1.Session(graph=graph)
    with pytest.raises(CSRunError, match="conv/kernel"):
        restore_variables(session, [other], path)
    with pytest.raises(CSRunError, match=r"trained with other shapes: dense/kernel \(4, 3\) there, \(5, 3\) in the model"):
        restore_variables(session, [wrong], path)


def test_keep_max_keeps_the_newest_and_deletes_the_others(tmp_path):
    for step in (10, 20, 30, 40):
        write_checkpoint(str(tmp_path), step, tensors(step), keep_max=2)
    assert all_checkpoints(str(tmp_path)) == [str(tmp_path / "model.ckpt-30"),
                                              str(tmp_path / "model.ckpt-40")]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-40")
    left = sorted(f for f in os.listdir(tmp_path) if f.startswith("model.ckpt"))
    assert left == ["model.ckpt-30.data-00000-of-00001", "model.ckpt-30.index",
                    "model.ckpt-40.data-00000-of-00001", "model.ckpt-40.index"]
    assert not [f for f in os.listdir(tmp_path) if "tmp" in f]


def test_a_torn_checkpoint_never_becomes_the_newest(tmp_path):
    write_checkpoint(str(tmp_path), 100, tensors(100), keep_max=3)
    # a crash while writing step 200: its data file exists, the index was not updated
    (tmp_path / "model.ckpt-200.data-00000-of-00001").write_bytes(b"partial")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-100")
    # the index names a checkpoint whose files are gone: it is skipped, not returned
    os.remove(tmp_path / "model.ckpt-100.index")
    assert latest_checkpoint(str(tmp_path)) is None
    # the run that writes 200 again replaces the torn files
    write_checkpoint(str(tmp_path), 200, tensors(200), keep_max=3)
    assert read_checkpoint(latest_checkpoint(str(tmp_path)))["global_step"] == 200


def test_an_empty_model_dir_has_no_checkpoint(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing")) is None
    assert all_checkpoints(str(tmp_path)) == []
    with pytest.raises(CSRunError, match="cannot read checkpoint"):
        read_checkpoint(str(tmp_path / "model.ckpt-5"))
