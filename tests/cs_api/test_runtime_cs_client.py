"""The chief's CS client: chunked tensors, and an unreachable CS as one clear error."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from common.errors import CSRunError
from cs_api.client import CSClient
from cs_api.tensors import assemble, tensor_chunks
from launcher.csrun_wse import free_port


def test_chunks_round_trip_exactly_above_grpc_message_limit():
    rng = np.random.default_rng(0)
    tensors = {"dense/kernel": rng.standard_normal((1500, 1000)).astype(np.float32),  # 6 MB
               "dense/bias": np.arange(3, dtype=np.float32), "beta1_power": np.float32(0.9),
               "steps": np.arange(4, dtype=np.int64)}
    chunks = [c for name, a in tensors.items() for c in tensor_chunks(name, np.asarray(a), 1 << 20)]
    assert max(len(c.data) for c in chunks) == 1 << 20
    back = assemble(iter(chunks))
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        value = np.asarray(value)
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        assert back[name].tobytes() == value.tobytes()


def test_unreachable_cs_is_one_clear_error():
    port = free_port()  # nothing listens there
    client = CSClient(f"127.0.0.1:{port}")
    try:
        with pytest.raises(CSRunError) as info:
            client.status()
    finally:
        client.close()
    assert info.value.message.startswith(f"cannot reach the CS system at 127.0.0.1:{port}")
    assert "wse_sim serve" in info.value.hint


def test_tokens_differ_per_job():
    a, b = CSClient("127.0.0.1:1"), CSClient("127.0.0.1:1")
    assert a.token != b.token and len(a.token) == 32
    a.close(), b.close()


class RpcErrorDouble(grpc.RpcError):
    """Test double: a failed call's status as gRPC hands it to the client."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize("code, details, starts, hint", [
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Sent message larger than max (300 vs. 269)",
     "a message of a Feed exceeds the CS API's limit of", "smaller batch_size"),
    (grpc.StatusCode.ALREADY_EXISTS, "the CS system is busy with another job",
     "the CS system at 127.0.0.1:1 is busy", "wait for the running job"),
    (grpc.StatusCode.INTERNAL, "batch 0: the simulated CS failed (KeyError: 'p1'), a csrun defect: please "
     "report it with the compile report", "the CS system at 127.0.0.1:1 failed in a Feed", "last good one"),
])
def test_a_refusal_names_its_cause(code, details, starts, hint):
    client = CSClient("127.0.0.1:1")
    try:
        error = client._error(RpcErrorDouble(code, details), "a Feed")
    finally:
        client.close()
    assert error.message.startswith(starts) and details in error.message
    assert hint in error.hint


def test_a_busy_cs_is_waited_for_up_to_the_time_given_saying_so_once(server, capsys):
    from tests.wse_sim.test_wse_server import program, weights

    holder = CSClient(server.address)
    holder.load("holder", program(), weights(), 1, 0, 0)
    waiting = CSClient(server.address)
    try:
        with pytest.raises(CSRunError, match=f"the CS system at {server.address} is busy") as busy:
            waiting.load("at-once", program(), weights(), 1, 0, 0)  # no wait: refused at once
        assert "--cs-wait SECONDS" in busy.value.hint
        with pytest.raises(CSRunError, match="is busy"):
            waiting.load("short", program(), weights(), 1, 0, 0, wait_s=0.5)
        threading.Timer(1.0, holder.unload).start()
        reply = waiting.load("patient", program(), weights(), 1, 0, 0, wait_s=60)
        assert reply.job_id
        out = capsys.readouterr().out
        assert out.count(f"The CS system at {server.address} is busy with another job: waiting up to ") == 2
    finally:
        holder.close()
        waiting.unload()
        waiting.close()
