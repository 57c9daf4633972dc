"""The FC-MNIST example: its data (MNIST IDX files or the digits) and its test accuracy."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from common.errors import CSRunError
from examples.cnn_digits import data as cnn_data
from examples.digits import TRAIN_SAMPLES, digits_split
from examples.fc_mnist import data, model
from launcher.run_config import run_config
from launcher.run_flow import estimator_for
from launcher.run_utils import get_params

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAMS = os.path.join(ROOT, "examples", "fc_mnist", "configs", "params.yaml")


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_mnist(directory, n_train=6, n_test=3):
    rng = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte.gz": rng.integers(0, 10, n_train),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test)}
    for name, array in arrays.items():
        raw = idx_bytes(array)
        (directory / name).write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    return arrays


def test_mnist_idx_files_are_read_plain_or_gzipped(tmp_path):
    arrays = write_mnist(tmp_path)
    config = {"data_dir": str(tmp_path), "batch_size": 3, "shuffle": False}
    features, labels = next(data.eval_input_fn({"eval_input": config}).as_numpy_iterator())
    np.testing.assert_allclose(features, arrays["t10k-images-idx3-ubyte"].reshape(3, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(labels, arrays["t10k-labels-idx1-ubyte"])
    train = data.train_input_fn({"train_input": {**config, "shuffle": True}})
    seen = np.concatenate([b[1] for b in train.take(4).as_numpy_iterator()])  # repeats forever
    assert sorted(seen[:6]) == sorted(arrays["train-labels-idx1-ubyte.gz"])


def test_broken_idx_files_are_one_clear_error(tmp_path):
    write_mnist(tmp_path)
    raw = (tmp_path / "t10k-images-idx3-ubyte").read_bytes()
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(raw[:-10])
    with pytest.raises(CSRunError, match="truncated"):
        data.mnist_split(str(tmp_path), training=False)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"not an idx file")
    with pytest.raises(CSRunError, match="is not an IDX file of unsigned bytes"):
        data.mnist_split(str(tmp_path), training=False)


def test_without_mnist_files_the_digits_become_28x28_images(tmp_path):
    params = {"train_input": {"data_dir": str(tmp_path), "batch_size": 256}}
    features, labels = next(data.train_input_fn(params).as_numpy_iterator())
    assert features.shape == (256, 784) and features.dtype == np.float32 and labels.dtype == np.int32
    images, _ = data.digits_as_mnist(training=True)
    eight, _ = digits_split(training=True)
    square = images.reshape(-1, 28, 28)
    np.testing.assert_array_equal(square[:, 2:26:3, 2:26:3], eight)  # 3x upscaled, 2 px border
    assert not square[:, :2].any() and not square[:, 26:].any()
    assert len(images) == TRAIN_SAMPLES and len(data.digits_as_mnist(training=False)[0]) == 1797 - TRAIN_SAMPLES


def test_the_digit_examples_share_one_split():
    cnn, cnn_labels = next(cnn_data.eval_input_fn({"eval_input": {"batch_size": 297}}).as_numpy_iterator())
    fc, fc_labels = next(data.eval_input_fn({"eval_input": {"batch_size": 297}}).as_numpy_iterator())
    np.testing.assert_array_equal(cnn_labels, fc_labels)
    np.testing.assert_array_equal(cnn[..., 0], fc.reshape(-1, 28, 28)[:, 2:26:3, 2:26:3])


@pytest.mark.slow
def test_fc_mnist_reaches_90_percent_test_accuracy(tmp_path):
    params = get_params(PARAMS)
    params["runconfig"]["model_dir"] = str(tmp_path)
    for section in ("train_input", "eval_input"):
        params[section]["data_dir"] = None
    est = estimator_for(model.model_fn, params, run_config(params["runconfig"]))
    assert params["model"]["hidden_sizes"] == [500, 300]
    est.train(data.train_input_fn, max_steps=params["runconfig"]["max_steps"])
    results = est.evaluate(data.eval_input_fn)
    assert results["accuracy"] >= 0.90, results
    assert results["global_step"] == params["runconfig"]["max_steps"]
