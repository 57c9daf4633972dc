"""MNIST input function (the original's fc_mnist/tf/data.py, on the images of
`examples.fc_mnist.data`: MNIST IDX files in data_dir, else the digits as 28x28 images).
The original converts the images to float16 for its mixed_float16 model; here the model
is mixed when `model.mixed_precision` is true, and the images are float16 then, float32
otherwise."""
import tensorflow as tf

from examples.fc_mnist.data import digits_as_mnist, mnist_split
from launcher.estimator import ModeKeys


def input_fn(params, mode=ModeKeys.TRAIN):
    """Batches of (784 pixels in [0, 1], int32 label), the pixels float16 when
    params["model"]["mixed_precision"] is true, else float32. Reads from
    params["train_input"] (training) or params["eval_input"]:

    - "data_dir" (string): where MNIST's IDX files are, if anywhere.
    - "batch_size" (int): batch size.
    - "shuffle" (bool), "shuffle_seed" (int): shuffle the training input, with this seed.
    - "num_parallel_calls" (int): parallel calls of the parsing map; 0 means AUTOTUNE.
    """
    training = mode == ModeKeys.TRAIN
    input_params = params["train_input"] if training else params["eval_input"]
    data_dir = input_params.get("data_dir")
    num_parallel_calls = input_params.get("num_parallel_calls", 0)
    pixels = tf.float16 if params["model"]["mixed_precision"] else tf.float32

    split = mnist_split(data_dir, training) if data_dir else None
    images, labels = split if split is not None else digits_as_mnist(training)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    if training and input_params.get("shuffle", True):
        ds = ds.shuffle(len(labels), seed=input_params.get("shuffle_seed"))
    if training:
        ds = ds.repeat()
    ds = ds.batch(input_params["batch_size"], drop_remainder=True)
    ds = ds.map(
        lambda x, y: (tf.cast(x, pixels), tf.cast(y, tf.int32)),
        num_parallel_calls=num_parallel_calls if num_parallel_calls > 0 else tf.data.AUTOTUNE,
    )
    return ds.prefetch(tf.data.AUTOTUNE)


def train_input_fn(params):
    return input_fn(params, mode=ModeKeys.TRAIN)


def eval_input_fn(params):
    return input_fn(params, mode=ModeKeys.EVAL)
