"""What SecureRound.unmask does with the control plane's refusals of stage 4 (client.secure),
over a stand-in transport (a unit test of the SDK's logic; the stages themselves run on real
parts in tests/secagg): a stage that closed without this client's shares (``stage_closed``:
enough shares came, or the round ended while it was slow) is no error, its update being in the
model; a masked sum that holds no vector of this client (``not_in_sum``) is raised, its update
being in no model of the round."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from client.errors import StageClosed
from client.secure import SecureRound


def _round(answer: httpx.Response) -> tuple[SecureRound, list[str]]:
    """A SecureRound whose control plane answers every stage-4 call with ``answer``; the
    calls it made."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        return answer

    part: Any = object.__new__(SecureRound)  # no model fetched: only stage 4 runs here
    part.job = SimpleNamespace(
        name="j", url="http://cp", timeout=5.0, transport=httpx.MockTransport(handle)
    )
    part.client, part.round, part.token, part.poll, part.deadline = "c1", 1, "t", 0.01, 0.0
    part.participant = SimpleNamespace(unmask=lambda dropped, survivors: ({}, {}))
    return part, calls


def _refusal(code: str, detail: str) -> httpx.Response:
    return httpx.Response(409, json={"error": code, "detail": detail})


def test_a_stage_closed_without_this_clients_shares_is_no_error() -> None:
    part, calls = _round(_refusal("stage_closed", "round 1 of 'j' ended without its shares"))
    part.unmask()
    assert calls == ["GET /v1/jobs/j/rounds/1/secagg/unmask"]


def test_a_sum_without_this_clients_vector_is_raised() -> None:
    part, _ = _round(_refusal("not_in_sum", "the round's masked sum holds no vector of c1"))
    with pytest.raises(StageClosed) as err:
        part.unmask()
    assert err.value.error == "not_in_sum"


def test_the_shares_are_posted_and_a_post_after_the_stage_closed_is_no_error() -> None:
    state = {"n": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        state["n"] += 1
        if request.method == "GET":
            return httpx.Response(200, json={"dropped": [], "survivors": ["c0", "c1"]})
        return _refusal("stage_closed", "the unmask stage closed")

    part, _ = _round(httpx.Response(200))
    part.job.transport = httpx.MockTransport(handle)
    part.unmask()
    assert state["n"] == 2
