"""Test doubles: the few stand-ins the tests use for parts of csrun they drive by hand."""
from __future__ import annotations

import threading
from typing import Iterator, Sequence

import grpc
import numpy as np

from cs_api import MESSAGE_OPTIONS, pb, rpc
from cs_api.client import load_requests
from cs_api.tensors import assemble, to_tensor


class ClientDouble:
    """The chief's and its input workers' CS API calls, made by hand: a token the test
    picks, the raw stub, and gRPC's own status codes. The real client (cs_api.client.
    CSClient) draws its own token, turns errors into one-line CSRunErrors and holds a lease,
    which is right for users and hides what the tests of the server's refusals check."""

    def __init__(self, address: str, token: str = "token-1"):
        self.channel = grpc.insecure_channel(address, options=MESSAGE_OPTIONS)
        self.stub = rpc.CSSystemStub(self.channel)
        self.token = token
        self.feed_errors: list[grpc.RpcError] = []

    def load(self, program: pb.Program, tensors: dict[str, np.ndarray], *, job_id: str = "job-1",
             num_workers: int = 1, first_batch: int = 0, global_step: int = 0) -> pb.LoadReply:
        header = pb.JobHeader(job_id=job_id, token=self.token, program=program,
                              num_workers=num_workers, global_step=global_step,
                              first_batch=first_batch)
        return self.stub.Load(load_requests(header, tensors))

    def feed_requests(self, batches: Sequence[dict[str, np.ndarray]], worker: int = 0,
                      num_workers: int = 1, first: int = 0, end: bool = True) -> Iterator[pb.FeedRequest]:
        """Worker `worker`'s FeedRequests, closed by its `end` message unless `end` is False."""
        for index in range(first + worker, first + len(batches), num_workers):
            yield pb.FeedRequest(token=self.token, worker_id=worker, batch_index=index, tensors=[
                to_tensor(name, array) for name, array in batches[index - first].items()])
        if end:
            yield pb.FeedRequest(token=self.token, worker_id=worker, end=True)

    def feed_in_background(self, batches: Sequence[dict[str, np.ndarray]], num_workers: int = 1,
                           first: int = 0) -> list[threading.Thread]:
        """One Feed stream per worker, each in a thread (worker w sends w, w + W, ...);
        their gRPC errors collect in `feed_errors`."""
        def stream(worker: int) -> None:
            try:
                self.stub.Feed(self.feed_requests(batches, worker, num_workers, first))
            except grpc.RpcError as error:
                self.feed_errors.append(error)

        threads = [threading.Thread(target=stream, args=(w,), daemon=True) for w in range(num_workers)]
        for t in threads:
            t.start()
        return threads

    def run(self, kind: str, steps: int,
            output_steps: Sequence[int] = ()) -> tuple[list[pb.StepResult], pb.JobSummary]:
        call = {"train": self.stub.Train, "evaluate": self.stub.Evaluate,
                "predict": self.stub.Predict}[kind]
        results = list(call(pb.RunRequest(token=self.token, steps=steps, output_steps=output_steps)))
        assert results[-1].HasField("summary")
        return [r.step for r in results[:-1]], results[-1].summary

    def snapshot(self, chunk_bytes: int = 0) -> dict[str, np.ndarray]:
        return assemble(self.stub.Snapshot(pb.SnapshotRequest(token=self.token, chunk_bytes=chunk_bytes)))

    def status(self) -> pb.StatusReply:
        return self.stub.Status(pb.StatusRequest(token=self.token))

    def unload(self) -> None:
        self.stub.Unload(pb.UnloadRequest(token=self.token))
