"""The one way the tests wait for something: poll it, with a generous bound, never sleep a fixed
time (PREAMBLE: a test never asserts a timing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T],
    timeout: float = 30.0,
    what: str = "the condition",
    *,
    interval: float = 0.05,
) -> T:
    """Call ``cond`` every ``interval`` seconds until it returns something true, and return
    that; AssertionError naming ``what`` once ``timeout`` seconds have passed without."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
