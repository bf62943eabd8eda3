"""The node's memory budget for request bodies and the shared-memory spool (unit tests)."""

from __future__ import annotations

import os

import pytest

from gateway.bodies import MemoryBudget, SpooledBody
from gateway.errors import Overloaded


def test_a_hold_past_the_limit_is_refused_and_takes_nothing() -> None:
    budget = MemoryBudget(100)
    a = budget.reserve(60, "a")
    with pytest.raises(Overloaded) as err:
        budget.reserve(41, "an upload of job j")
    assert err.value.status == 503 and err.value.headers() == [("retry-after", "1")]
    assert "an upload of job j" in err.value.detail and "max_inflight_bytes" in err.value.detail
    assert (budget.used, budget.refused) == (60, 1)
    b = budget.reserve(40, "b")
    with pytest.raises(Overloaded):
        b.grow(1)  # growing past it keeps what it held
    assert b.nbytes == 40 and budget.used == 100 and budget.peak == 100
    a.release()
    a.release()  # a second release gives nothing back twice
    b.release()
    assert budget.used == 0


def test_no_limit_takes_everything() -> None:
    budget = MemoryBudget(0)
    budget.reserve(1 << 50, "huge").release()
    assert budget.used == 0 and budget.peak == 1 << 50


def _memfds(name: str) -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [p for p in links if p.startswith(f"/memfd:{name}")]


def test_a_spooled_body_is_a_memfd_of_its_size_filled_in_place_and_freed() -> None:
    with SpooledBody(1 << 20, "fedfaas-test-body") as body:
        body.view[:5] = b"hello"
        assert len(body.view) == 1 << 20 and bytes(body.view[:5]) == b"hello"
        assert _memfds("fedfaas-test-body")
    assert len(body.view) == 0 and not _memfds("fedfaas-test-body")
    assert len(SpooledBody(0).view) == 0
