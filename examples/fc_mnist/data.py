"""input_fn of FC-MNIST: 784-feature images in [0, 1] and int32 labels.

With `data_dir` holding the MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally .gz) those are read;
otherwise scikit-learn's 8x8 digits (`examples.digits`), upscaled 3x and padded to 28x28 as
MNIST centres its digits, so the model stays the original 784-500-300-10.
"""
from __future__ import annotations

import gzip
import os

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from examples.digits import batched, digits_split

IMAGE_SIDE = 28
MNIST_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
_IDX_UBYTE = 0x08


def read_idx(path: str) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format), gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as error:
        raise CSRunError(f"cannot read {path}: {error}", "replace the file with an intact copy") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UBYTE or raw[3] == 0:
        raise CSRunError(f"{path} is not an IDX file of unsigned bytes",
                         "use MNIST's *-idx3-ubyte / *-idx1-ubyte files")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise CSRunError(f"{path} holds {data.size} bytes of data, its header says {shape}",
                         "the file is truncated: replace it with an intact copy")
    return data.reshape(shape)


def _find(data_dir: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            return path
    return None


def mnist_split(data_dir: str, training: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """MNIST's train or test split from `data_dir`, or None if the files are not there."""
    paths = [_find(data_dir, name) for name in MNIST_FILES[training]]
    if None in paths:
        return None
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise CSRunError(f"{paths[0]} and {paths[1]} do not match: images {images.shape}, "
                         f"labels {labels.shape}", "use the images and labels of one MNIST split")
    return (images.reshape(len(images), -1).astype(np.float32) / 255.0), labels.astype(np.int32)


def digits_as_mnist(training: bool) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as 28x28 images (3x nearest upscaling, 2 pixels of border)."""
    images, labels = digits_split(training)
    large = images.repeat(3, axis=1).repeat(3, axis=2)
    pad = (IMAGE_SIDE - large.shape[1]) // 2
    framed = np.pad(large, ((0, 0), (pad, pad), (pad, pad)))
    return framed.reshape(len(framed), IMAGE_SIDE * IMAGE_SIDE), labels


def _dataset(config: dict, training: bool) -> tf.data.Dataset:
    data_dir = config.get("data_dir")
    split = mnist_split(data_dir, training) if data_dir else None
    features, labels = split if split is not None else digits_as_mnist(training)
    return batched(features, labels, config, training)


def train_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["train_input"], training=True)


def eval_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["eval_input"], training=False)
