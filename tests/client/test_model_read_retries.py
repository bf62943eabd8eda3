"""The SDK's model read asks again on a 503 with ``Retry-After`` (a node still fetching the
new version from its root, ``tests/dataplane/test_model_version_gap.py``), within its bounds:
``BUSY_RETRIES`` tries and ``busy_wait`` seconds in all; a 503 without ``Retry-After``, or one
past the bounds, is :class:`GatewayUnavailable` at once. A unit test of the retry logic only:
the gateway's answers are scripted on an ``httpx.MockTransport``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from client import node
from client.errors import GatewayUnavailable
from client.node import FLClient

MODEL = save({"w": np.arange(4, dtype=np.float32)})


def _busy(retry_after: str | None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = {"error": "unavailable", "detail": "node b is fetching model version 2"}
    return httpx.Response(503, headers=headers, content=json.dumps(body).encode())


def _model() -> httpx.Response:
    return httpx.Response(200, headers={"X-Model-Version": "2", "ETag": '"v2"'}, content=MODEL)


def _client(answers: Iterator[httpx.Response], seen: list[httpx.Request]) -> FLClient:
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return next(answers)

    return FLClient("http://gw", "j1", "c1", "tok", transport=httpx.MockTransport(handler))


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(node.time, "sleep", slept.append)
    return slept


def test_a_busy_answer_is_asked_again_after_its_wait(no_sleep: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = _client(iter([_busy("1"), _busy("2"), _model()]), seen)
    m = c.fetch_model()
    assert (m.version, m.data) == (2, MODEL)
    assert len(seen) == 3 and no_sleep == [1.0, 2.0]


def test_a_503_without_retry_after_is_unavailable_at_once(no_sleep: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = _client(iter([_busy(None), _model()]), seen)
    with pytest.raises(GatewayUnavailable):
        c.fetch_model()
    assert len(seen) == 1 and no_sleep == []


def test_the_retries_are_bounded_in_count(no_sleep: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = _client(iter([_busy("1")] * (node.BUSY_RETRIES + 5)), seen)
    with pytest.raises(GatewayUnavailable):
        c.fetch_model()
    assert len(seen) == node.BUSY_RETRIES + 1


def test_the_retries_are_bounded_in_time(no_sleep: list[float]) -> None:
    seen: list[httpx.Request] = []
    c = _client(iter([_busy("4")] * 10), seen)
    with pytest.raises(GatewayUnavailable):
        c.fetch_model(busy_wait=10.0)
    assert no_sleep == [4.0, 4.0] and len(seen) == 3
