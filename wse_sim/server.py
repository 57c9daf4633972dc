"""The CS API over gRPC: a thin servicer that translates messages and calls into CSSystem,
plus the standard health service. Messages above cs_api.MAX_MESSAGE_BYTES are refused
by gRPC before they are received whole; keepalive pings end the calls (and so the lease)
of a client whose host froze or vanished. With a certificate and key the port speaks TLS
only."""
from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.run_kinds import RunKind
from cs_api import MESSAGE_OPTIONS
from cs_api import cs_api_pb2 as pb
from cs_api import cs_api_pb2_grpc as rpc
from wse_sim.cs_system import CSSystem
from wse_sim.errors import CSError

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CSSystem"].full_name
KEEPALIVE_S = 10  # a ping every 10 s; a client that does not answer within 10 s is gone
SERVER_OPTIONS = (*MESSAGE_OPTIONS,
                  ("grpc.so_reuseport", 0),  # a taken port is an error, not shared
                  ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
                  ("grpc.keepalive_timeout_ms", KEEPALIVE_S * 1000),
                  ("grpc.http2.max_pings_without_data", 0))
MAX_THREADS = 32  # calls served at once: a run, its input streams, lease, status and snapshot


@dataclass(frozen=True)
class TLSFiles:
    """The server's certificate chain and private key (PEM files)."""

    cert: Path
    key: Path

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key.read_bytes(), self.cert.read_bytes())])


class CSServicer(rpc.CSSystemServicer):
    def __init__(self, cs: CSSystem):
        self.cs = cs

    @staticmethod
    def _abort(context: grpc.ServicerContext, error: CSError):
        context.abort(error.code, error.message)

    def Load(self, request_iterator, context):
        try:
            first = next(request_iterator, None)
            if first is None or not first.HasField("header"):
                raise CSError(grpc.StatusCode.INVALID_ARGUMENT,
                              "a Load stream starts with a JobHeader")

            def chunks() -> Iterator[pb.TensorChunk]:  # read only once the header is accepted
                for request in request_iterator:
                    if not request.HasField("chunk"):
                        raise CSError(grpc.StatusCode.INVALID_ARGUMENT,
                                      "a Load stream has one JobHeader, then TensorChunks")
                    yield request.chunk

            return self.cs.load(first.header, chunks())
        except CSError as error:
            self._abort(context, error)

    def Feed(self, request_iterator, context):
        try:
            return self.cs.feed(request_iterator)
        except CSError as error:
            self._abort(context, error)

    def _run(self, kind: RunKind, request: pb.RunRequest, context) -> Iterator[pb.RunResult]:
        cancelled = threading.Event()
        try:
            results = self.cs.run(kind, request, cancelled)
            context.add_callback(lambda: self.cs.cancel(cancelled))
            yield from results
        except CSError as error:
            self._abort(context, error)

    def Train(self, request, context):
        return self._run(RunKind.TRAIN, request, context)

    def Evaluate(self, request, context):
        return self._run(RunKind.EVALUATE, request, context)

    def Predict(self, request, context):
        return self._run(RunKind.PREDICT, request, context)

    def Snapshot(self, request, context):
        try:
            yield from self.cs.snapshot(request.token, request.chunk_bytes)
        except CSError as error:
            self._abort(context, error)

    def Status(self, request, context):
        return self.cs.status(request.token)

    def Lease(self, request, context):
        try:
            lease = self.cs.lease(request.token)
        except CSError as error:
            self._abort(context, error)
        context.add_callback(lambda: self.cs.end_lease(lease))
        yield from self.cs.beats(lease)

    def Unload(self, request, context):
        try:
            self.cs.unload(request.token)
        except CSError as error:
            self._abort(context, error)
        return pb.UnloadReply()


class CSServer:
    """A CSSystem served on host:port (CS API and gRPC health), over TLS given `tls`."""

    def __init__(self, cs: CSSystem, host: str, port: int, tls: TLSFiles | None = None):
        self.cs = cs
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_THREADS,
                                                             thread_name_prefix="cs-call"),
                                  options=SERVER_OPTIONS)
        rpc.add_CSSystemServicer_to_server(CSServicer(cs), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{host}:{port}"
        # RuntimeError if taken
        self.port = (self.server.add_secure_port(address, tls.credentials()) if tls is not None
                     else self.server.add_insecure_port(address))
        self.address = f"{host}:{self.port}"

    def start(self) -> "CSServer":
        self.server.start()
        self.cs.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace: float = 2.0) -> None:
        """Refuse new calls, end the job, and stop (calls in progress get `grace` seconds)."""
        self.health.enter_graceful_shutdown()
        self.cs.close()
        self.server.stop(grace).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()
