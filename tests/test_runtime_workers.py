"""Input workers: sharding, serialization, shape checks, rendezvous."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tensorflow as tf

from launcher.errors import CSRunError
from wse_sim.api import pb
from workers.feed import check_batch, feed_requests, flatten, shard, shard_batches, to_tensor
from workers.rendezvous import InputSpec, Rendezvous, publish, rendezvous_path, wait_for

BATCH = 4


def input_fn(params):
    """A shuffled, repeating dataset of (features, labels) batches, seeded like the examples."""
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    y = np.arange(40, dtype=np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(40, seed=7).repeat()
    return ds.batch(BATCH, drop_remainder=True)


def make_rendezvous(start=0, count=10, workers=1, inputs=None):
    inputs = inputs or (InputSpec("features", "float32", (BATCH, 3)), InputSpec("labels", "int32", (BATCH,)))
    return Rendezvous("127.0.0.1:1", "job", "tok", workers, start, count, tuple(inputs))


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


def test_feed_requests_serialize_raw_bytes_with_token_and_index():
    rdv = make_rendezvous(2, 4, 2)
    requests = list(feed_requests(shard_batches(input_fn, {}, rdv, 1), rdv, 1))
    assert [r.batch_index for r in requests] == [3, 5]
    ref = reference_batches(2, 4)
    for r, (x, y) in zip(requests, [ref[1], ref[3]]):
        assert r.token == "tok" and r.worker_id == 1
        feats, labels = r.tensors
        assert (feats.name, feats.dtype, list(feats.shape)) == ("features", pb.FLOAT32, [BATCH, 3])
        np.testing.assert_array_equal(np.frombuffer(feats.data, np.float32).reshape(BATCH, 3), x)
        assert (labels.name, labels.dtype) == ("labels", pb.INT32)
        np.testing.assert_array_equal(np.frombuffer(labels.data, np.int32), y)


def test_to_tensor_big_endian_becomes_little_endian():
    t = to_tensor("x", np.arange(3, dtype=">f4"))
    np.testing.assert_array_equal(np.frombuffer(t.data, "<f4"), [0, 1, 2])


def test_flatten_dict_features():
    named = flatten(({"a": np.zeros(2), "b": np.ones(2)}, np.zeros(2)))
    assert sorted(named) == ["features.a", "features.b", "labels"]


def test_shape_mismatch_names_both_shapes():
    rdv = make_rendezvous(inputs=(InputSpec("features", "float32", (BATCH, 5)),
                                  InputSpec("labels", "int32", (BATCH,))))
    with pytest.raises(CSRunError) as info:
        list(feed_requests(shard_batches(input_fn, {}, rdv, 0), rdv, 0))
    assert "features is (4, 3) float32, the compiled program takes (4, 5) float32" in info.value.message


def test_dtype_mismatch_and_missing_input_are_named():
    specs = (InputSpec("features", "float32", (BATCH, 3)), InputSpec("labels", "int64", (BATCH,)))
    batch = {"features": np.zeros((BATCH, 3), np.float32), "labels": np.zeros(BATCH, np.int32)}
    with pytest.raises(CSRunError, match=r"labels is \(4,\) int32, the compiled program takes \(4,\) int64"):
        check_batch(batch, specs, 0, 0)
    with pytest.raises(CSRunError, match=r"has inputs \['features'\], the compiled program takes"):
        check_batch({"features": batch["features"]}, specs, 0, 0)


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
