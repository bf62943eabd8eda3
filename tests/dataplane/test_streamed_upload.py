"""The SDK's streamed upload (client.stream, client.node.FLClient.upload): a state dict of numpy
arrays is sent as the exact bytes ``safetensors.numpy.save`` makes, written while it is sent,
never whole in memory first; a real node gateway takes it and aggregates it.

Unit tests use an httpx mock transport; the integration test runs a real node gateway
(``python -m gateway``) with real Redis and a warm ``aggregator`` replica.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from client.sdk import FLClient, create_job
from client.stream import CHUNK, SafetensorsBody, streamable
from tests.dataplane.gwproc import gateway_process


def _contiguous(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # safetensors.numpy.save writes a strided array's underlying memory, not its values:
    # the reference is made from C-contiguous copies
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def _mixed() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "conv.weight": rng.standard_normal((64, 3, 7, 7)).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64),
        "bn.running_mean": rng.standard_normal(64).astype(np.float64),
        "half": rng.standard_normal(33).astype(np.float16),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(5, dtype=np.uint8),
        "small": np.arange(6, dtype=np.int8).reshape(2, 3),
        "i16": np.arange(4, dtype=np.int16),
        "u16": np.arange(4, dtype=np.uint16),
        "i32": np.arange(4, dtype=np.int32),
        "u32": np.arange(4, dtype=np.uint32),
        "u64": np.arange(4, dtype=np.uint64),
        "empty": np.zeros((0, 4), np.float32),
        "naïve": np.ones(2, np.float32),
    }


@pytest.mark.parametrize(
    "tensors",
    [
        _mixed(),
        {"only": np.arange(3 * CHUNK // 4 + 5, dtype=np.float32)},  # over 3 chunks
        {},
    ],
    ids=["mixed-dtypes", "several-chunks", "empty"],
)
def test_the_streamed_body_is_byte_for_byte_what_safetensors_saves(
    tensors: dict[str, np.ndarray],
) -> None:
    body = SafetensorsBody(tensors)
    want = save(tensors)
    assert body.nbytes == len(body) == len(want)
    chunks = list(body)
    assert b"".join(chunks) == want
    assert all(len(c) <= CHUNK for c in chunks)
    assert b"".join(body) == want  # iterated again (an upload sent once more): the same bytes


def test_strided_and_big_endian_arrays_are_sent_as_their_values() -> None:
    grid = np.arange(60, dtype=np.float32).reshape(6, 10)
    tensors = {"cols": grid[:, ::3], "t": grid.T, "be": np.arange(9, dtype=">i4")}
    got = b"".join(SafetensorsBody(tensors))
    assert got == save(_contiguous(tensors))
    from safetensors.numpy import load

    back = load(got)
    for k, v in tensors.items():
        assert np.array_equal(back[k], v) and back[k].shape == v.shape


def test_what_safetensors_has_no_dtype_for_is_not_streamed() -> None:
    assert streamable({"a": np.ones(2, np.float32), "b": np.ones(1, ">f8")})
    assert not streamable({"c": np.ones(2, np.complex64)})
    assert not streamable({"o": np.array(["x"], object)})
    assert not streamable({"l": [1.0, 2.0]})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        SafetensorsBody({"c": np.ones(2, np.complex64)})


class _Draining(httpx.BaseTransport):
    """A server that reads the body as it comes and keeps none of it (httpx's MockTransport
    reads the whole body first): its length, its first bytes and the request's headers."""

    def __init__(self) -> None:
        self.read = 0
        self.head = b""
        self.headers: dict[str, str] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.headers = dict(request.headers)
        for chunk in request.stream:  # type: ignore[union-attr]
            if len(self.head) < 64:
                self.head = (self.head + chunk)[:64]
            self.read += len(chunk)
        return httpx.Response(202, json={"key": "ab" * 16, "round": 1, "client": "c1"})


def test_an_upload_of_a_state_dict_sends_saves_bytes_without_making_them_first() -> None:
    """The body arrives as ``save`` would make it, with an exact Content-Length; the SDK
    holds no copy of the model while it sends: the most memory Python allocated during the
    upload is far below the model's size (building the body first costs at least one)."""
    rng = np.random.default_rng(0)
    state = {f"layer{i}.weight": rng.standard_normal(1 << 20).astype(np.float32) for i in range(8)}
    model_bytes = sum(v.nbytes for v in state.values())  # 32 MiB
    server = _Draining()
    c = FLClient("http://gw", "job", "c1", "tok", transport=server)
    tracemalloc.start()
    try:
        receipt = c.upload(1, state, num_samples=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    want = save(state)
    assert server.headers["content-length"] == str(len(want))
    assert "transfer-encoding" not in server.headers
    assert server.read == len(want) and server.head == want[:64]
    assert receipt.round == 1 and receipt.key == "ab" * 16
    assert peak < model_bytes // 4, f"{peak} bytes allocated while sending {model_bytes}"


def test_an_upload_of_a_state_dict_sends_exactly_what_save_makes() -> None:
    seen: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.read())
        return httpx.Response(202, json={"key": "cd" * 16, "round": 2, "client": "c1"})

    state = _mixed()
    c = FLClient("http://gw", "job", "c1", "tok", transport=httpx.MockTransport(handler))
    c.upload(2, state, num_samples=3)
    c.upload(2, save(state), num_samples=3)  # bytes, as before
    assert seen[0] == seen[1] == save(state)


@pytest.mark.integration
def test_a_real_gateway_aggregates_streamed_uploads(tmp_path: Path, redis_url: str) -> None:
    """Two clients upload their state dicts (one of them strided arrays) through the SDK's
    streamed path; the gateway seals, aggregates and publishes their sample-weighted mean."""
    rng = np.random.default_rng(1)
    shapes = {"fc.weight": (32, 300), "fc.bias": (32,), "head.weight": (10, 32)}
    init = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    wide = rng.standard_normal((32, 600)).astype(np.float32)
    b = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    b["fc.weight"] = wide[:, ::2]  # not contiguous: sent as its values
    with gateway_process(tmp_path, redis_url) as (gw, admin):
        job = create_job(gw.url, admin, "stream", save(init), rounds=1, goal=2, clients=["a", "b"])
        FLClient(gw.url, "stream", "a", job.tokens["a"]).upload(1, a, num_samples=30)
        FLClient(gw.url, "stream", "b", job.tokens["b"]).upload(1, b, num_samples=10)
        model = FLClient(gw.url, "stream", "a", job.tokens["a"]).wait_for_version(1, timeout=60)
    from safetensors.numpy import load

    got = load(model.data)
    assert json.loads(model.data[8 : 8 + int.from_bytes(model.data[:8], "little")])
    for k in shapes:
        want = (30 * a[k].astype(np.float64) + 10 * b[k].astype(np.float64)) / 40
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)
