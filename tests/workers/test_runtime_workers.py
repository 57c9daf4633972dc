"""Input workers: sharding, serialization, shape checks, rendezvous."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from cs_api import pb
from cs_api.input_spec import InputSpec
from cs_api.tensors import to_tensor
from workers.feed import check_batch, feed_requests, flatten, shard, shard_batches, worker_dataset
from workers.rendezvous import Rendezvous, publish, rendezvous_path, wait_for

BATCH = 4


def input_fn(params):
    """A shuffled, repeating dataset of (features, labels) batches, seeded like the examples."""
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    y = np.arange(40, dtype=np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(40, seed=7).repeat()
    return ds.batch(BATCH, drop_remainder=True)


def make_rendezvous(start=0, count=10, workers=1, inputs=None):
    inputs = inputs or (InputSpec("features", "float32", (3,)), InputSpec("labels", "int32", ()))
    return Rendezvous("127.0.0.1:1", "job", "tok", workers, start, count, tuple(inputs), BATCH)


def reference_batches(start, count):
    ds = input_fn({}).skip(start).take(count)
    return [b for b in ds.as_numpy_iterator()]


def test_shard_covers_every_batch_once_in_round_robin():
    for start in (0, 3, 7):
        for workers in (1, 2, 3):
            shards = [list(shard(start, 11, w, workers)) for w in range(workers)]
            assert sorted(sum(shards, [])) == list(range(start, start + 11))
            for w, indices in enumerate(shards):
                assert all(k % workers == w for k in indices)


@pytest.mark.parametrize("workers,start", [(1, 0), (2, 0), (3, 5)])
def test_workers_together_send_input_fn_batches_in_order(workers, start):
    """Determinism contract: batch k of a run is batch k of input_fn, for any W, after resume."""
    count = 9
    rdv = make_rendezvous(start, count, workers)
    got = {}
    for w in range(workers):
        for index, element in shard_batches(input_fn, {}, rdv, w):
            assert index % workers == w
            got[index] = element
    assert sorted(got) == list(range(start, start + count))
    for k, (x, y) in zip(range(start, start + count), reference_batches(start, count)):
        np.testing.assert_array_equal(got[k][0], x)
        np.testing.assert_array_equal(got[k][1], y)


def test_a_worker_streams_its_shard_without_tf_data_autotuning():
    """Its iterator is deleted at the end of the stream without waiting for an autotuning
    thread; the user's own options are kept, and the batches are the shard's."""
    def tuned(params):
        options = tf.data.Options()
        options.deterministic = True
        return input_fn(params).map(lambda x, y: (x, y), num_parallel_calls=tf.data.AUTOTUNE).with_options(options)

    rdv = make_rendezvous(1, 6, 2)
    dataset = worker_dataset(tuned({}), rdv, 0)
    assert dataset.options().autotune.enabled is False and dataset.options().deterministic is True
    expected = reference_batches(1, 6)[1::2]  # batches 2, 4, 6: worker 0 of 2 from batch 1
    got = list(dataset.as_numpy_iterator())
    assert len(got) == len(expected) == 3
    for (x, y), (ex, ey) in zip(got, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


def test_feed_requests_serialize_raw_bytes_with_token_and_index():
    rdv = make_rendezvous(2, 4, 2)
    *requests, last = feed_requests(shard_batches(input_fn, {}, rdv, 1), rdv, 1)
    assert [r.batch_index for r in requests] == [3, 5]
    assert last.end and last.token == "tok" and not last.tensors  # the shard is complete
    ref = reference_batches(2, 4)
    for r, (x, y) in zip(requests, [ref[1], ref[3]]):
        assert r.token == "tok" and r.worker_id == 1
        feats, labels = r.tensors
        assert (feats.name, feats.dtype, list(feats.shape)) == ("features", pb.FLOAT32, [BATCH, 3])
        np.testing.assert_array_equal(np.frombuffer(feats.data, np.float32).reshape(BATCH, 3), x)
        assert (labels.name, labels.dtype) == ("labels", pb.INT32)
        np.testing.assert_array_equal(np.frombuffer(labels.data, np.int32), y)


def test_float64_features_of_a_float32_input_are_streamed_as_tensorflows_cast():
    """input_fn's float64 features (numpy's default: thirds), compiled as a float32 input
    (every reader casts them to float32): the worker sends float32, rounded as tf.cast."""
    x = np.arange(40 * 3).reshape(40, 3) / 3.0

    def float64_input_fn(params):
        return tf.data.Dataset.from_tensor_slices((x, np.arange(40, dtype=np.int32))).batch(BATCH)

    rdv = make_rendezvous(0, 2)
    *requests, _ = feed_requests(shard_batches(float64_input_fn, {}, rdv, 0), rdv, 0)
    for index, request in enumerate(requests):
        feats = request.tensors[0]
        assert feats.dtype == pb.FLOAT32
        np.testing.assert_array_equal(np.frombuffer(feats.data, np.float32).reshape(BATCH, 3),
                                      tf.cast(x[index * BATCH:(index + 1) * BATCH], tf.float32))


def test_to_tensor_big_endian_becomes_little_endian():
    t = to_tensor("x", np.arange(3, dtype=">f4"))
    np.testing.assert_array_equal(np.frombuffer(t.data, "<f4"), [0, 1, 2])


def test_flatten_dict_features():
    named = flatten(({"a": np.zeros(2), "b": np.ones(2)}, np.zeros(2)))
    assert sorted(named) == ["features.a", "features.b", "labels"]


def test_shape_mismatch_names_both_shapes():
    rdv = make_rendezvous(inputs=(InputSpec("features", "float32", (5,)),
                                  InputSpec("labels", "int32", ())))
    with pytest.raises(CSRunError) as info:
        list(feed_requests(shard_batches(input_fn, {}, rdv, 0), rdv, 0))
    assert "features is (4, 3) float32, the compiled program takes (4, 5) float32" in info.value.message


def test_dtype_mismatch_and_missing_input_are_named():
    specs = (InputSpec("features", "float32", (3,)), InputSpec("labels", "int64", ()))
    batch = {"features": np.zeros((BATCH, 3), np.float32), "labels": np.zeros(BATCH, np.int32)}
    with pytest.raises(CSRunError, match=r"labels is \(4,\) int32, the compiled program takes \(4,\) int64"):
        check_batch(batch, specs, BATCH, 0, 0)
    with pytest.raises(CSRunError, match=r"has inputs \['features'\], the compiled program takes"):
        check_batch({"features": batch["features"]}, specs, BATCH, 0, 0)


def test_finite_input_that_runs_out_is_an_error():
    def short(params):
        return tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), np.float32),
                                                   np.zeros(8, np.int32))).batch(BATCH)
    rdv = make_rendezvous(0, 5, 1)
    with pytest.raises(CSRunError, match="ran out after batch 1, the run needs batches up to 4"):
        list(shard_batches(short, {}, rdv, 0))


def test_rendezvous_round_trip_is_private_and_atomic(tmp_path):
    path = rendezvous_path("1-train", "job7", tmp_path / "job", tmp_path / "model")
    assert path == tmp_path / "job" / "rendezvous" / "1-train.json"
    assert rendezvous_path("1-train", "job7", None, tmp_path / "m") == \
        tmp_path / "m" / "cs_rendezvous" / "job7" / "1-train.json"
    rdv = make_rendezvous(3, 5, 2)
    publish(path, rdv)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["1-train.json"]
    assert wait_for(path, timeout_s=1) == rdv


def test_rendezvous_wait_times_out_with_a_clear_error(tmp_path):
    with pytest.raises(CSRunError, match="did not publish"):
        wait_for(tmp_path / "none.json", timeout_s=0.2)


# ---- streaming, against a test double of the CS's Feed call (a real gRPC server) ----

import threading  # noqa: E402
import time  # noqa: E402
from concurrent import futures  # noqa: E402

import grpc  # noqa: E402

from cs_api import rpc  # noqa: E402
from workers.feed import stream  # noqa: E402


class SlowFeedDouble(rpc.CSSystemServicer):
    """Test double of the CS: consumes Feed messages slowly, or refuses the stream."""

    def __init__(self, delay=0.0, refuse_after=None):
        self.delay, self.refuse_after, self.received = delay, refuse_after, []

    def Feed(self, request_iterator, context):
        for request in request_iterator:
            if self.refuse_after is not None and len(self.received) == self.refuse_after:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "wrong job token")
            self.received.append((request.batch_index, sum(len(t.data) for t in request.tensors)))
            time.sleep(self.delay)
        return pb.FeedReply(batches_received=len(self.received))


def serve(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.max_receive_message_length", -1)])
    rpc.add_CSSystemServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def big_requests(count, produced):
    """800 KB batches (FC-MNIST at batch 256), counting how many the worker has produced."""
    x = np.zeros((256, 784), np.float32)
    for k in range(count):
        produced.append(k)
        yield pb.FeedRequest(token="t", worker_id=0, batch_index=k, tensors=[to_tensor("features", x)])


def test_stream_delivers_every_batch_in_order():
    double = SlowFeedDouble()
    server, address = serve(double)
    try:
        stats = stream(big_requests(20, []), address, 0)
    finally:
        server.stop(0)
    assert [k for k, _ in double.received] == list(range(20))
    assert stats.batches == 20 and stats.bytes == 20 * 256 * 784 * 4


def test_a_slow_cs_keeps_the_worker_from_running_ahead():
    """Flow control: the worker produces batches only as the CS takes them (bounded buffer)."""
    double = SlowFeedDouble(delay=0.03)
    server, address = serve(double)
    produced = []
    ahead = []

    def watch():
        while len(double.received) < 60:
            ahead.append(len(produced) - len(double.received))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    try:
        watcher.start()
        stream(big_requests(60, produced), address, 0)
        watcher.join()
    finally:
        server.stop(0)
    # bounded by the HTTP/2 window the CS grants (about a dozen 800 KB batches), not the input
    assert max(ahead) <= 30, max(ahead)


def test_a_refused_stream_is_one_clear_error():
    server, address = serve(SlowFeedDouble(refuse_after=2))
    try:
        with pytest.raises(CSRunError) as info:
            stream(big_requests(10, []), address, 3)
    finally:
        server.stop(0)
    assert info.value.message == (f"input worker 3: the CS at {address} ended the input stream: "
                                  "PERMISSION_DENIED: wrong job token")
