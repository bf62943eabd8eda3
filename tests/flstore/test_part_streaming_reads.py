"""How a cache function reads the ranges it streams from the cold store (issue 36: at 200
ResNet-18-sized updates past the node's budget, FedFaaS's Gram queries were slower than
ObjStore-Agg's whole-object reads: each chunk was hundreds of small ranged reads that started
and ended inside MinIO's blocks, each block read whole and checked by MinIO)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import save

from cache_engine.cold_store import MemoryColdStore, TensorIndex
from cache_engine.keys import ObjectKey
from functions.flstore.parts import (
    STORE_BLOCK,
    Holdings,
    PartRequest,
    RemoteParts,
    chunks,
    serve,
)

BLOCK = STORE_BLOCK // 4  # floats


def _index(tensors: dict[str, NDArray[Any]]) -> TensorIndex:
    raw = save(tensors)
    n = int.from_bytes(raw[:8], "little")
    return TensorIndex.parse(raw[8 : 8 + n], 8 + n)


def _flat(dim: int) -> dict[str, NDArray[np.float32]]:
    return {"bias": np.zeros(10, np.float32), "w": np.zeros(dim - 10, np.float32)}


def test_a_stream_cuts_its_range_on_the_blocks_of_the_objects_bytes() -> None:
    index = _index(_flat(3_000_000))
    start = index.flat_start()
    assert start is not None
    a, b = 123_457, 2_900_001
    cuts = chunks(a, b, 2 * BLOCK + 999, index)
    assert cuts[0] == a and cuts[-1] == b and cuts == sorted(set(cuts))
    assert all(y - x <= 2 * BLOCK for x, y in zip(cuts, cuts[1:], strict=False))
    assert all((start + 4 * c) % STORE_BLOCK == 0 for c in cuts[1:-1])  # on the blocks
    assert len(cuts) - 1 <= (b - a) // (2 * BLOCK) + 2
    # a chunk smaller than a block, or a model not float32 from end to end: plain steps
    assert chunks(a, b, 100_000, index) == [*range(a, b, 100_000), b]
    mixed = _index({**_flat(3_000_000), "bias": np.zeros(10, np.float16)})
    assert mixed.flat_start() is None
    assert chunks(a, b, 2 * BLOCK, mixed) == [*range(a, b, 2 * BLOCK), b]
    assert chunks(5, 20, 2 * BLOCK, index) == [5, 20]


class _Reads(MemoryColdStore):
    """A cold store (pure logic) that notes every ranged read's first byte and length."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []

    def read_into(self, key: ObjectKey, offset: int, out: memoryview) -> None:
        self.reads.append((offset, len(out)))
        super().read_into(key, offset, out)


def test_a_streamed_gram_reads_each_object_a_chunk_at_a_time_on_the_stores_blocks() -> None:
    dim, n = 2_000_000, 3
    rng = np.random.default_rng(0)
    store = _Reads()
    whole = {c: rng.normal(size=dim).astype(np.float32) for c in "abc"}
    for c, v in whole.items():
        store.put_bytes(ObjectKey("job", 1, "update", c), save({"bias": v[:10], "w": v[10:]}))
    ids = [ObjectKey("job", 1, "update", c).id for c in "abc"]
    index = store.header(ObjectKey.parse(ids[0]))
    start = index.flat_start()
    assert start is not None
    a, b = 70_001, dim
    chunk_bytes = 4 * n * 2 * BLOCK  # two blocks of each object at a time
    body = PartRequest(
        "gram",
        (a, b),
        None,
        ids,
        [[(1.0, i)] for i in ids],
        {"credentials": {}, "chunk_bytes": chunk_bytes},
        None,
        dim,
    ).to_json()
    h = Holdings(lambda _k: None, lambda _job, _grants: store)
    got = np.frombuffer(serve(body, h)).reshape(n, n)
    x = np.stack([whole[c][a:b].astype(np.float64) for c in "abc"])
    np.testing.assert_allclose(got, x @ x.T, rtol=1e-5)
    # one read per object and chunk, each (the range's first aside) from a block's start
    firsts = [off for off, _ in store.reads if off != start + 4 * a]
    assert all(off % STORE_BLOCK == 0 for off in firsts), firsts[:5]
    assert len(store.reads) == n * (len(chunks(a, b, 2 * BLOCK, index)) - 1)
    assert max(size for _, size in store.reads) == STORE_BLOCK * 2
    assert h.stats["streamed_requests"] == len(store.reads)
    assert h.stats["streamed_bytes"] == 4 * n * (b - a)


def test_a_reducer_asks_a_few_functions_at_once_those_that_stream_first() -> None:
    """Ten functions computing their parts at once on two cores took each several times longer
    than a few at a time: a reducer asks at most ``at_once`` functions at once, the functions
    that stream from the cold store first (they take longest)."""
    at_once, functions = 3, [f"f{i}" for i in range(7)]
    streaming = {"f5", "f6"}  # last in the plan's order
    cond = threading.Condition()
    state = {"active": 0, "peak": 0, "done": 0}
    entered: list[str] = []

    def remote(function: str, _endpoint: str | None, body: dict[str, Any]) -> bytes:
        with cond:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
            entered.append(function)
            cond.notify_all()
            # hold until as many as the reducer may ask are under way (all of them, for a
            # reducer that asks every function at once), so that the peak shows its limit
            assert cond.wait_for(
                lambda: state["active"] >= min(at_once, len(functions) - state["done"]), 30
            ), (state, entered)
        with cond:
            state["active"] -= 1
            state["done"] += 1
            cond.notify_all()
        n = len(body["rows"])
        return np.ones((n, n)).tobytes()

    dim = 16 * len(functions)
    slices = [
        {
            "bounds": [16 * k, 16 * (k + 1)],
            "part": None if f in streaming else [k, 7],
            "function": f,
        }
        for k, f in enumerate(functions)
    ]
    ids = [ObjectKey("job", 1, "update", c).id for c in "ab"]
    parts = RemoteParts(
        slices, ids, {"credentials": {}}, "me", lambda b: b"", remote, None, at_once
    )
    got = parts.gram([[(1.0, i)] for i in ids])
    np.testing.assert_array_equal(got, np.full((2, 2), float(len(functions))))
    assert state["peak"] == at_once, state
    assert set(entered[:2]) == streaming, entered
    assert sorted(entered) == functions and dim == slices[-1]["bounds"][1]
