"""The cache function's status reads its objects while another request changes them: the
watchdog runs requests on a thread pool, and the soak saw ``/ping`` and ``/run`` fail with
HTTP 500 "dictionary changed size during iteration" while a ``/load`` landed. Deterministic:
another thread inserts an object in the middle of the status' sum."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from functions.flstore import handler as h


def test_the_status_sum_is_not_torn_by_a_load_in_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(h, "_objects", {})
    monkeypatch.setattr(h._lending, "objects", h._objects)
    for i in range(4):
        h._objects[f"k{i}"] = np.zeros(8, np.float32)
    size = h._size
    inserted = threading.Event()

    def load_elsewhere() -> None:  # a /load in another thread, as the handler stores objects
        with h._lock:
            h._objects["new"] = np.zeros(8, np.float32)
        inserted.set()

    def size_then_race(v: object) -> int:
        if not inserted.is_set() and "racer" not in threads:
            threads["racer"] = threading.Thread(target=load_elsewhere)
            threads["racer"].start()
            inserted.wait(0.2)  # the lock held by the sum keeps the insert out until it ends
        return int(size(v))

    threads: dict[str, threading.Thread] = {}
    monkeypatch.setattr(h, "_size", size_then_race)
    assert h._used() == 4 * 32  # the sum over the objects it started with, not torn
    threads["racer"].join(5)
    assert inserted.is_set() and h._used() == 5 * 32  # the load landed right after
