"""An input worker: run input_fn, take this worker's shard of batches, stream them to the CS.

Worker w of W sends batches k ≡ w (mod W) of input_fn's order, for k in
[start_batch, start_batch + num_batches) — a resumed run starts at its checkpoint's step,
so nothing already consumed is sent again. Each batch is checked against the program's
inputs, serialized once (raw bytes of each array), and handed to gRPC's client stream
through a generator: gRPC pulls the next batch only when HTTP/2 flow control lets it send,
so a slow CS never makes a worker buffer more than tf.data's small prefetch.

A worker of a CS on its own host (a loopback address: csrun_wse's embedded simulator)
writes its batches into a shared input file instead (`cs_api.shared_input`: no
serialization, its messages carry batch indices), at most SLOTS batches ahead of those the
CS took; a CS that cannot open the file gets the batches in the messages.
"""
from __future__ import annotations

import functools
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import grpc
import numpy as np

from common.errors import CSRunError
from common.run_kinds import RunKind
from common.task_failure import CS, rank_cause
from cs_api import pb, rpc
from cs_api.client import cs_channel, is_loopback
from cs_api.input_spec import InputSpec, as_streamed
from cs_api.liveness import Liveness
from cs_api.shared_input import SHARED_REFUSED, SharedInputWriter, SlotLayout
from cs_api.tensors import tensor_bytes, to_tensor
from tf_model.model_fn import input_ran_out, make_dataset, named_inputs, numpy_batches
from workers.rendezvous import Rendezvous

PREFETCH = 2


def shard(start: int, count: int, worker: int, num_workers: int) -> range:
    """The batch indices worker `worker` of `num_workers` sends from [start, start + count)."""
    first = start + (worker - start) % num_workers
    return range(first, start + count, num_workers)


def flatten(element: Any) -> dict[str, np.ndarray]:
    """A (features, labels) batch as the program's named inputs (`named_inputs`)."""
    features, labels = element if isinstance(element, tuple) else (element, None)
    return {k: np.asarray(v) for k, v in named_inputs(features, labels).items()}


def _describe(shape: tuple[int, ...], dtype: str) -> str:
    return f"{tuple(int(d) for d in shape)} {dtype}"


def check_batch(named: dict[str, np.ndarray], inputs: tuple[InputSpec, ...], batch_size: int,
                index: int, worker: int) -> None:
    """Stop with both shapes named when a batch is not what the program was compiled for."""
    expected = {spec.name for spec in inputs}
    if set(named) != expected:
        raise CSRunError(
            f"input worker {worker}: batch {index} has inputs {sorted(named)}, "
            f"the compiled program takes {sorted(expected)}",
            "make input_fn yield what the program was compiled for (recompile after changing it)")
    for spec in inputs:
        array, shape = named[spec.name], spec.batch_shape(batch_size)
        if tuple(array.shape) != shape or array.dtype.name != spec.dtype:
            raise CSRunError(
                f"input worker {worker}: batch {index} {spec.name} is "
                f"{_describe(array.shape, array.dtype.name)}, the compiled program takes "
                f"{_describe(shape, spec.dtype)}",
                "make input_fn yield batches of the compiled shape and dtype (drop_remainder=True "
                "for a fixed batch size), or recompile")


def feed_requests(batches: Iterable[tuple[int, Any]], rendezvous: Rendezvous,
                  worker: int) -> Iterator[pb.FeedRequest]:
    """FeedRequests for (batch index, input_fn element) pairs, each checked and serialized."""
    order = [spec.name for spec in rendezvous.inputs]
    for index, element in batches:
        named = as_streamed(flatten(element), rendezvous.inputs)
        check_batch(named, rendezvous.inputs, rendezvous.batch_size, index, worker)
        yield pb.FeedRequest(token=rendezvous.token, worker_id=worker, batch_index=index,
                             tensors=[to_tensor(name, named[name]) for name in order])
    yield pb.FeedRequest(token=rendezvous.token, worker_id=worker, end=True)


def shared_requests(batches: Iterable[tuple[int, Any]], rendezvous: Rendezvous, worker: int,
                    shared: SharedInputWriter, ended: threading.Event) -> Iterator[pb.FeedRequest]:
    """The same stream through `shared`: the file named first (alone), then for each batch,
    checked and written into its slot, a message of its index. Ends early when the call
    ended (`ended`: the CS refused the file or the stream)."""
    yield pb.FeedRequest(token=rendezvous.token, worker_id=worker,
                         shared_input=pb.SharedInput(name=shared.name, slots=shared.slots))
    if not shared.wait_opened(ended.is_set):
        return
    for index, element in batches:
        named = as_streamed(flatten(element), rendezvous.inputs)
        check_batch(named, rendezvous.inputs, rendezvous.batch_size, index, worker)
        if not shared.write(named, ended.is_set):
            return
        yield pb.FeedRequest(token=rendezvous.token, worker_id=worker, batch_index=index)
    yield pb.FeedRequest(token=rendezvous.token, worker_id=worker, end=True)


class SharedInputRefused(Exception):
    """The CS could not open the stream's shared input file (not on its host, another
    user's, another /dev/shm): nothing was consumed, the batches go in the messages."""


class JobEnded(Exception):
    """The chief ended the CS job (unloaded it, e.g. after a NaN loss) while this worker was
    still streaming: not this worker's failure; the chief reports why."""


@dataclass(frozen=True)
class FeedStats:
    batches: int
    bytes: int
    seconds: float

    @property
    def megabytes_per_sec(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def stream(requests: Iterable[pb.FeedRequest], cs_ip: str, worker: int,
           tls_ca: str | None = None, ended: threading.Event | None = None,
           shared_batch_bytes: int = 0) -> FeedStats:
    """Send `requests` as one Feed stream; a refused or broken stream is one clear error.
    `ended` is set when the call ends; `shared_batch_bytes` counts a batch that went
    through a shared input file."""
    sent = {"batches": 0, "bytes": 0}
    failure: list[BaseException] = []

    def counted() -> Iterator[pb.FeedRequest]:
        try:
            for request in requests:
                batch = not request.end and not request.HasField("shared_input")
                sent["batches"] += batch
                sent["bytes"] += sum(tensor_bytes(t) for t in request.tensors) if request.tensors \
                    else batch * shared_batch_bytes
                yield request
        except GeneratorExit:  # gRPC closed the stream (the CS ended it): not our error
            raise
        except BaseException as error:  # gRPC swallows iterator errors: keep ours
            failure.append(error)
            raise

    start = time.perf_counter()
    open_channel = functools.partial(cs_channel, tls_ca=tls_ca)
    with open_channel(cs_ip) as channel:
        future = rpc.CSSystemStub(channel).Feed.future(counted())
        if ended is not None:
            future.add_done_callback(lambda _: ended.set())
        try:
            with Liveness(cs_ip, future.cancel, open_channel) as live:
                future.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            if failure:
                raise failure[0] from None
            if live.dead or not isinstance(error, grpc.RpcError):
                raise CSRunError(f"input worker {worker}: {live.dead or 'the CS stopped answering'}",
                                 "see the CS system's log", caused_by=CS) from None
            details = error.details() or ""
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(SHARED_REFUSED):
                raise SharedInputRefused(details) from None
            if error.code() == grpc.StatusCode.ABORTED and \
                    ("unloaded by its client" in details or "the client cancelled" in details):
                raise JobEnded(f"input worker {worker}: the chief ended the job ({error.details()})") from None
            raise CSRunError(
                f"input worker {worker}: the CS at {cs_ip} ended the input stream: "
                f"{error.code().name}: {error.details()}",
                "see the chief's log (task 0) for the job's state",
                caused_by=_stream_end_cause(error.code(), details)) from None
    if failure:
        raise failure[0]
    return FeedStats(sent["batches"], sent["bytes"], time.perf_counter() - start)


def _stream_end_cause(code: grpc.StatusCode, details: str) -> str:
    """Whose failure a Feed stream the CS ended follows (`common.task_failure`): the CS's when
    it went away or stopped, the chief's when the CS ended the job (ABORTED), else its own (a
    batch the CS refused)."""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or \
            "the CS system stopped" in details:
        return CS
    return rank_cause(0) if code == grpc.StatusCode.ABORTED else ""


def input_dataset(input_fn: Callable, params: dict) -> Any:
    """input_fn(params) as a tf.data.Dataset, under the graph seed the CPU path's model_graph
    sets (a worker builds it while the chief compiles, before the rendezvous)."""
    import tensorflow as tf

    seed = (params.get("runconfig") or {}).get("tf_random_seed")
    if seed is not None:
        tf.random.set_seed(int(seed))
    return make_dataset(input_fn, params)


def worker_dataset(dataset: Any, rendezvous: Rendezvous, worker: int) -> Any:
    """Worker `worker`'s shard of `dataset` (input_fn's), as it streams it: without tf.data's
    autotuning, whose model thread can keep the finished iterator's deletion waiting for the
    rest of its optimization period (up to a minute: seen in TensorFlow 2.21 as a worker
    ending 20-40 s after the run); the batches are the same."""
    import tensorflow as tf

    first = shard(rendezvous.start_batch, rendezvous.num_batches, worker, rendezvous.num_workers).start
    options = tf.data.Options()
    options.autotune.enabled = False
    return (dataset.skip(rendezvous.start_batch)
            .take(rendezvous.num_batches)
            .shard(rendezvous.num_workers, first - rendezvous.start_batch)
            .prefetch(PREFETCH)
            .with_options(options))


def shard_batches(input_fn: Callable, params: dict, rendezvous: Rendezvous, worker: int,
                  dataset: Any = None) -> Iterator[tuple[int, Any]]:
    """This worker's (batch index, numpy batch) pairs from input_fn(params) (or its
    `input_dataset`, built already), eagerly."""
    indices = shard(rendezvous.start_batch, rendezvous.num_batches, worker, rendezvous.num_workers)
    if len(indices) == 0:
        return
    dataset = worker_dataset(input_dataset(input_fn, params) if dataset is None else dataset,
                             rendezvous, worker)
    produced = 0
    for index, element in zip(indices, numpy_batches(dataset)):
        produced += 1
        yield index, element
    if produced < len(indices):
        last = indices[produced - 1] if produced else rendezvous.start_batch - 1
        raise input_ran_out(RunKind(rendezvous.kind), f"after batch {last}, the run needs batches up to {indices[-1]}",
                            f"input worker {worker}: ")


def run_worker(input_fn: Callable, params: dict, rendezvous: Rendezvous, worker: int,
               dataset: Any = None) -> FeedStats:
    """Stream this worker's shard of input_fn(params) (or of its `input_dataset`, built
    already) to the CS named by the rendezvous."""
    batches = shard_batches(input_fn, params, rendezvous, worker, dataset)
    tls_ca = rendezvous.cs_tls_ca or None
    shared = shared_input(rendezvous)
    if shared is not None:
        with closing(shared):
            ended = threading.Event()
            try:
                return stream(shared_requests(batches, rendezvous, worker, shared, ended), rendezvous.cs_ip,
                              worker, tls_ca, ended, shared.layout.payload_bytes())
            except SharedInputRefused:
                pass
    return stream(feed_requests(batches, rendezvous, worker), rendezvous.cs_ip, worker, tls_ca)


def shared_input(rendezvous: Rendezvous) -> SharedInputWriter | None:
    """A shared input file for a stream to a CS on this host (a loopback address), or None
    (another host, or no room in /dev/shm)."""
    if not is_loopback(rendezvous.cs_ip.rpartition(":")[0]):
        return None
    try:
        return SharedInputWriter(SlotLayout.of(rendezvous.inputs, rendezvous.batch_size))
    except OSError:
        return None
