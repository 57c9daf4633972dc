"""The chief's connection to the CS system: the CS API calls, with gRPC failures turned
into one-line user errors (unreachable CS, CS busy with another job, refused program).
Channels (the chief's and the workers') carry the CS API's message limits and speak TLS,
verifying the CS's certificate, when the site names a CA (`launcher.site_config`). From
Load on, the client holds the job's lease: if this process dies the CS frees itself."""
from __future__ import annotations

import ipaddress
import os
import pwd
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

import grpc
import numpy as np

from common.errors import CSRunError
from common.run_kinds import RunKind
from common.task_failure import CS, worker_cause
from cs_api import MAX_MESSAGE_BYTES, MESSAGE_OPTIONS, pb, rpc
from cs_api.liveness import Liveness
from cs_api.tensors import assemble, tensor_chunks

CONNECT_TIMEOUT_S = 10.0
BUSY_RETRY_S = 2.0  # how often a busy CS is asked again while the job waits for it
_BROKEN_STREAM = re.compile(r"the input stream of worker (\d+) broke")  # the CS's ABORTED of a run


def new_token() -> str:
    """A per-job secret the chief hands to its workers; the CS refuses streams without it."""
    return secrets.token_hex(16)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name, IPv6 in brackets or not) is this host's loopback."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def cs_channel(cs_ip: str, tls_ca: str | None = None) -> grpc.Channel:
    """A channel to the CS at `cs_ip`: TLS verified with the CA certificate file `tls_ca`
    (the site's `cs.tls_ca`), plaintext without one."""
    if not tls_ca:
        return grpc.insecure_channel(cs_ip, options=MESSAGE_OPTIONS)
    try:
        root = Path(tls_ca).read_bytes()
    except OSError as error:
        raise CSRunError(f"cannot read the CS system's CA certificate {tls_ca}: {error.strerror}",
                         "fix cs.tls_ca in csrun.yaml") from None
    return grpc.secure_channel(cs_ip, grpc.ssl_channel_credentials(root), options=MESSAGE_OPTIONS)


def this_user() -> str:
    """The user a job is declared for (`JobHeader.user`): this process's login name."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def cs_status(cs_ip: str, tls_ca: str | None = None) -> pb.StatusReply:
    """What the CS at `cs_ip` tells any caller (no job's token): idle, or busy with which
    job; one line (CSRunError) when it does not answer."""
    client = CSClient(cs_ip, tls_ca)
    try:
        return client.status()
    finally:
        client.close()


def holder_text(reply: pb.StatusReply) -> str:
    """`idle`, or `busy with job ID of USER since TIME, step N` (a tokenless Status reply)."""
    if reply.state == "idle":
        return "idle"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(reply.since)) if reply.since else "?"
    return f"{reply.state} with job {reply.job_id} of {reply.user or '?'} since {since}, step {reply.global_step}"


def load_requests(header: pb.JobHeader, tensors: Mapping[str, np.ndarray]) -> Iterator[pb.LoadRequest]:
    """A Load call's messages: the job's header, then each tensor's chunks, by name."""
    yield pb.LoadRequest(header=header)
    for name in sorted(tensors):
        for chunk in tensor_chunks(name, tensors[name]):
            yield pb.LoadRequest(chunk=chunk)


class _Busy(Exception):
    """Load refused: the CS holds another job (`error` is what the user is told)."""

    def __init__(self, error: CSRunError):
        super().__init__(str(error))
        self.error = error


class CSClient:
    """One job's calls to the CS at `cs_ip`."""

    def __init__(self, cs_ip: str, tls_ca: str | None = None):
        self.cs_ip = cs_ip
        self.tls_ca = tls_ca
        self._channel = cs_channel(cs_ip, tls_ca)
        self._stub = rpc.CSSystemStub(self._channel)
        self.token = new_token()

    def _open_channel(self, cs_ip: str) -> grpc.Channel:
        return cs_channel(cs_ip, self.tls_ca)

    def close(self) -> None:
        self._channel.close()

    def _error(self, error: grpc.RpcError, doing: str, live: Liveness | None = None) -> CSRunError:
        if live is not None and live.dead:
            return CSRunError(f"{live.dead} during {doing}",
                              "see the CS system's log (wse_sim.log in the job folder for the "
                              "embedded one); the newest checkpoint is the last good one", caused_by=CS)
        code = error.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return CSRunError(f"cannot reach the CS system at {self.cs_ip} ({doing}): {error.details()}",
                              "check --cs_ip and that the CS system (wse_sim serve) is running", caused_by=CS)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # gRPC's own message size limit
            return CSRunError(f"a message of {doing} exceeds the CS API's limit of "
                              f"{MAX_MESSAGE_BYTES:,} bytes: {error.details()}",
                              "use a smaller batch_size (a batch of inputs or outputs must fit "
                              "in one message)")
        if code == grpc.StatusCode.ALREADY_EXISTS or \
                (code == grpc.StatusCode.FAILED_PRECONDITION and "busy" in (error.details() or "")):
            return CSRunError(f"the CS system at {self.cs_ip} is busy: {error.details()}",
                              "wait for the running job to finish (csrun_wse --cs-wait SECONDS waits "
                              "for it), or use another CS system")
        if code == grpc.StatusCode.INTERNAL:  # the simulator's own defect, said by the CS
            return CSRunError(f"the CS system at {self.cs_ip} failed in {doing}: {error.details()}",
                              "the newest checkpoint is the last good one", caused_by=CS)
        broken = _BROKEN_STREAM.search(error.details() or "") if code == grpc.StatusCode.ABORTED else None
        return CSRunError(f"the CS system at {self.cs_ip} refused {doing}: {code.name}: {error.details()}",
                          caused_by=worker_cause(int(broken.group(1))) if broken else "")

    def status(self) -> pb.StatusReply:
        try:
            return self._stub.Status(pb.StatusRequest(token=self.token), timeout=CONNECT_TIMEOUT_S,
                                     wait_for_ready=False)
        except grpc.RpcError as error:
            raise self._error(error, "status") from None

    def load(self, job_id: str, program: pb.Program, tensors: dict[str, np.ndarray],
             num_workers: int, global_step: int, first_batch: int, wait_s: float = 0.0) -> pb.LoadReply:
        """Load the program with its weights (and optimizer slots) for this job; its first
        step consumes batch `first_batch` of input_fn's order. A CS busy with another job is
        asked again every BUSY_RETRY_S for up to `wait_s` seconds, saying so once."""
        header = pb.JobHeader(job_id=job_id, token=self.token, program=program,
                              num_workers=num_workers, global_step=global_step,
                              first_batch=first_batch, user=this_user())
        deadline = time.monotonic() + wait_s
        while True:
            try:
                reply = self._load(header, tensors)
                break
            except _Busy as busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise busy.error from None
                if wait_s and left + BUSY_RETRY_S > wait_s:  # the first refusal
                    print(f"The CS system at {self.cs_ip} is busy with another job: waiting up to "
                          f"{wait_s:.0f} s for it", flush=True)
                time.sleep(min(BUSY_RETRY_S, left))
        self._hold_lease()
        return reply

    def _load(self, header: pb.JobHeader, tensors: dict[str, np.ndarray]) -> pb.LoadReply:
        future = self._stub.Load.future(load_requests(header, tensors))
        with Liveness(self.cs_ip, future.cancel, self._open_channel) as live:
            try:
                return future.result()
            except grpc.FutureCancelledError:  # only the liveness watch cancels it
                raise CSRunError(f"{live.dead or 'the CS system stopped answering'} during the load",
                                 "see the CS system's log", caused_by=CS) from None
            except grpc.RpcError as error:
                failure = self._error(error, "the program", live)
                if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                    raise _Busy(failure) from None
                raise failure from None

    def _hold_lease(self) -> None:
        """Hold the job's lease until the job ends or this client closes (or dies)."""
        call = self._stub.Lease(pb.LeaseRequest(token=self.token))

        def hold() -> None:
            try:
                for _ in call:
                    pass
            except grpc.RpcError:
                pass  # the job ended or the CS went away: the job's own calls say which

        threading.Thread(target=hold, name="cs-lease", daemon=True).start()

    def run(self, kind: RunKind, steps: int, output_steps: tuple[int, ...] = ()) -> Iterator[pb.RunResult]:
        """The Train / Evaluate / Predict stream of per-step results, then the job summary."""
        call = {RunKind.TRAIN: self._stub.Train, RunKind.EVALUATE: self._stub.Evaluate,
                RunKind.PREDICT: self._stub.Predict}[kind]
        responses = call(pb.RunRequest(token=self.token, steps=steps, output_steps=output_steps))
        with Liveness(self.cs_ip, responses.cancel, self._open_channel) as live:
            try:
                yield from responses
            except grpc.RpcError as error:
                raise self._error(error, kind, live) from None

    def snapshot(self) -> dict[str, np.ndarray]:
        """The job's weights and optimizer slots, by TF variable / slot name."""
        responses = self._stub.Snapshot(pb.SnapshotRequest(token=self.token))
        with Liveness(self.cs_ip, responses.cancel, self._open_channel) as live:
            try:
                return assemble(responses)
            except grpc.RpcError as error:
                raise self._error(error, "the snapshot", live) from None

    def unload(self) -> None:
        try:
            self._stub.Unload(pb.UnloadRequest(token=self.token), timeout=CONNECT_TIMEOUT_S)
        except (grpc.RpcError, ValueError):  # ValueError: channel already closed
            pass  # the job ends either way; the CS frees it when the token's job is gone
