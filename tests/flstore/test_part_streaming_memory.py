"""What a cache function holds while it streams parts of a round from the cold store.

The cache engine's plan gives each streaming function ``chunk_bytes`` of the queries' working
memory (``cache_engine.parts``), but one function may be sent several ranges of a query (the
parts not held, joined into runs) or the ranges of two queries. At 200 ResNet-18-sized updates
the functions streamed those ranges at once, each with a chunk of its own, and took the node
past its memory budget. A function streams one ``/part`` at a time into one buffer of at most
``chunk_bytes``, and a reducer asks a function's ranges one after the other.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from cache_engine.cold_store import MemoryColdStore, TensorIndex
from cache_engine.keys import ObjectKey
from functions.flstore.parts import Holdings, PartRequest, RemoteParts, serve

N = 3
DIM = 1 << 19
CHUNK = 1 << 20  # the least a plan may give: each stream reads its range in 3 chunks
IDS = [ObjectKey("job", 1, "update", c).id for c in ("a", "b", "c")]
#: how long a stream's first read waits for the other stream's reads (they come within
#: milliseconds when both run at once; the bound only limits how long the test waits)
GRACE_S = 1.0


class _Overlaps(MemoryColdStore):
    """A cold store (pure logic) that notes which streams read at once: a read of coordinates
    below ``DIM // 2`` belongs to stream 0, the others to stream 1. The first read of stream 0
    waits until stream 1 has started and then, for :data:`GRACE_S`, for its reads."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.active: Counter[int] = Counter()
        self.overlapped = False
        self.reads: Counter[int] = Counter()
        self.second_started = threading.Event()
        self.second_read = threading.Event()

    def read_range(
        self,
        key: ObjectKey,
        start: int,
        stop: int,
        index: TensorIndex | None = None,
        out: NDArray[np.float32] | None = None,
    ) -> NDArray[np.float32]:
        stream = int(start >= DIM // 2)
        with self.lock:
            first = self.reads[stream] == 0
            self.reads[stream] += 1
            self.active[stream] += 1
            self.overlapped |= self.active[1 - stream] > 0
        try:
            if stream == 1:
                self.second_read.set()
            elif first:
                assert self.second_started.wait(30), "the second stream never started"
                self.second_read.wait(GRACE_S)
                with self.lock:
                    self.overlapped |= self.active[1] > 0 or self.reads[1] > 0
            return super().read_range(key, start, stop, index, out)
        finally:
            with self.lock:
                self.active[stream] -= 1


def _round(store: MemoryColdStore) -> dict[str, NDArray[np.float32]]:
    rng = np.random.default_rng(0)
    whole = {c: rng.normal(size=DIM).astype(np.float32) for c in "abc"}
    store.write_round("job", 1, {c: {"w": v} for c, v in whole.items()}, None, {}, {})
    return whole


def _gram_body(bounds: tuple[int, int]) -> dict[str, Any]:
    return PartRequest(
        "gram",
        bounds,
        None,
        list(IDS),
        [[(1.0, i)] for i in IDS],
        {"credentials": {}, "chunk_bytes": CHUNK},
        None,
        DIM,
    ).to_json()


def test_a_function_streams_one_part_at_a_time_in_one_buffer_of_chunk_bytes() -> None:
    store = _Overlaps()
    whole = _round(store)
    h = Holdings(lambda _k: None, lambda _job, _grants: store)
    answers: dict[int, bytes] = {}

    def ask(stream: int) -> None:
        if stream == 1:
            store.second_started.set()
        a = stream * DIM // 2
        answers[stream] = serve(_gram_body((a, a + DIM // 2)), h)

    threads = [threading.Thread(target=ask, args=(s,)) for s in (0, 1)]
    threads[0].start()
    # the second stream starts once the first has begun reading
    deadline = time.monotonic() + 30
    while store.reads[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    threads[1].start()
    for t in threads:
        t.join(60)
    assert not store.overlapped, "two streams held chunks at once"
    assert h.stats["streamed_buffer_bytes"] <= CHUNK
    assert min(store.reads.values()) > N  # chunk after chunk, not the whole range at once
    for stream in (0, 1):  # the answers are those of the whole vectors over each range
        a = stream * DIM // 2
        x = np.stack([whole[c][a : a + DIM // 2].astype(np.float64) for c in "abc"])
        got = np.frombuffer(answers[stream]).reshape(N, N)
        np.testing.assert_allclose(got, x @ x.T, rtol=1e-6)


def test_a_reducer_asks_the_functions_at_once_and_each_ones_ranges_in_turn() -> None:
    lock = threading.Lock()
    active: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    met = threading.Event()
    overlapped: list[str] = []

    def remote(function: str, _endpoint: str | None, body: dict[str, Any]) -> bytes:
        with lock:
            active[function] += 1
            calls[function] += 1
            first = calls[function] == 1
            if active[function] > 1:
                overlapped.append(function)
            if active["f1"] and active["f2"]:
                met.set()
        try:
            if first:  # the other function's first range, and any second range of this one
                assert met.wait(30), "the functions were not asked at once"
                deadline = time.monotonic() + GRACE_S
                while time.monotonic() < deadline and not overlapped:
                    time.sleep(0.01)
            n = len(body["rows"])
            return np.ones((n, n)).tobytes()
        finally:
            with lock:
                active[function] -= 1

    third = DIM // 3
    slices = [
        {"bounds": [0, third], "part": None, "function": "f1"},
        {"bounds": [third, 2 * third], "part": None, "function": "f2"},
        {"bounds": [2 * third, DIM], "part": None, "function": "f1"},
    ]
    parts = RemoteParts(slices, list(IDS), {"credentials": {}}, "me", lambda b: b"", remote)
    got = parts.gram([[(1.0, i)] for i in IDS])
    np.testing.assert_array_equal(got, np.full((N, N), 3.0))
    assert calls == Counter({"f1": 2, "f2": 1})
    assert overlapped == [], f"ranges of {overlapped} asked at once"


def test_a_ranged_read_fills_the_buffer_it_is_given() -> None:
    store = MemoryColdStore()
    whole = _round(store)
    key = ObjectKey("job", 1, "update", "b")
    buf = np.full(DIM, np.nan, np.float32)
    got = store.read_range(key, 100, 300, out=buf[:200])
    assert np.shares_memory(got, buf)
    np.testing.assert_array_equal(buf[:200], whole["b"][100:300])
    assert np.isnan(buf[200:]).all()
    with pytest.raises(ValueError, match="out must be 200 contiguous float32"):
        store.read_range(key, 100, 300, out=np.empty(199, np.float32))
