"""The chief's CS client: chunked tensors, and an unreachable CS as one clear error."""
from __future__ import annotations

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
