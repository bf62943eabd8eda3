"""core.parallel.run_all: every call runs, at once, and an error surfaces only after all end."""

from __future__ import annotations

import threading
import time

import pytest

from core.parallel import run_all


def test_every_call_runs_on_its_own_thread_and_all_have_ended_on_return() -> None:
    seen: list[str] = []
    barrier = threading.Barrier(3, timeout=10)  # three calls that must run at the same time

    def call(name: str) -> None:
        barrier.wait()
        seen.append(f"{name}:{threading.current_thread().name}")

    run_all([lambda n=n: call(n) for n in "abc"])
    assert sorted(s.split(":")[0] for s in seen) == ["a", "b", "c"]
    assert len({s.split(":")[1] for s in seen}) == 3


def test_an_error_is_raised_after_the_other_calls_have_ended() -> None:
    ended: list[int] = []

    def slow() -> None:
        time.sleep(0.1)
        ended.append(1)

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_all([fail, slow, slow])
    assert ended == [1, 1]
