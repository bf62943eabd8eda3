"""The bench's reference for rounds too large for memory (issue 36's 120 and 200 updates): the
same answers as the whole-matrix reference, block of columns after block."""

from __future__ import annotations

import copy

import pytest

from bench.flstore_reference import (
    RTOL,
    agrees,
    reference_from_store,
    reference_from_store_streamed,
)
from bench.flstore_rounds import gtg_params, queries, write_job
from cache_engine.cold_store import MemoryColdStore
from cache_engine.keys import ObjectKey


@pytest.fixture(scope="module")
def job() -> MemoryColdStore:
    cold = MemoryColdStore()
    write_job(cold, "big5", 5)  # type: ignore[arg-type]
    return cold


@pytest.mark.parametrize("workload", ["cosine-to-aggregate", "multi-krum", "foolsgold"])
def test_the_inner_product_workloads_equal_the_whole_matrix_reference(
    job: MemoryColdStore, workload: str
) -> None:
    body = dict(queries("big5", gtg_params(), [workload])[0][1])
    whole = reference_from_store(job, body)
    assert whole is not None
    reads: list[tuple[int, int]] = []
    real = job.read_range

    def counted(key: ObjectKey, a: int, b: int, *args: object, **kw: object) -> object:
        reads.append((a, b))
        return real(key, a, b, *args, **kw)  # type: ignore[arg-type]

    job.read_range = counted  # type: ignore[method-assign]
    try:
        streamed = reference_from_store_streamed(job, body, block_bytes=8 << 20)
    finally:
        del job.read_range
    assert streamed is not None
    assert agrees(streamed, whole, RTOL) == []
    assert len({a for a, _ in reads}) > 10  # many blocks of columns, none whole
    wrong = copy.deepcopy(streamed)
    key = {"cosine-to-aggregate": "cosine", "multi-krum": "scores", "foolsgold": "max_similarity"}
    first = sorted(wrong[key[workload]])[2]
    wrong[key[workload]][first] *= 1.001
    assert agrees(wrong, whole, RTOL) == [key[workload]]


def test_leave_one_out_and_gtg_shapleys_ends_equal_the_whole_model_reference(
    job: MemoryColdStore,
) -> None:
    loo = dict(queries("big5", gtg_params(), ["leave-one-out"])[0][1])
    whole = reference_from_store(job, loo)
    assert whole is not None
    assert agrees(reference_from_store_streamed(job, loo) or {}, whole, RTOL) == []
    exact = dict(queries("big5", gtg_params(), ["shapley"])[0][1])
    exact["params"] = {"method": "exact"}
    full = reference_from_store(job, exact)
    assert full is not None
    assert agrees(reference_from_store_streamed(job, exact) or {}, full, RTOL) == []
    gtg = dict(queries("big5", gtg_params(), ["shapley"])[0][1])
    ends = reference_from_store_streamed(job, gtg)
    assert ends is not None and set(ends) == {"v_empty", "v_full"}
    assert agrees(ends, {k: full[k] for k in ends}, RTOL) == []
    assert ends["v_full"] != ends["v_empty"]


def test_the_big_rounds_hold_every_systems_answer_to_the_reference(job: MemoryColdStore) -> None:
    from bench.flstore_rounds_reference import against_reference

    only = ["multi-krum", "leave-one-out", "shapley"]
    right = {
        wl: {"result": reference_from_store(job, body)}
        for wl, body in queries("big5", gtg_params(), only)
        if wl != "shapley"
    }
    right["shapley"] = {"result": {"values": {}, "v_empty": 0.0, "v_full": 1.0}}
    wrong = copy.deepcopy(right)
    wrong["multi-krum"]["result"]["krum"] = "c004"
    got = against_reference(
        job,
        queries("big5", gtg_params(), only),
        {"fedfaas": {"queries": right}, "objstore-agg": {"queries": wrong}, "cache-agg": None},
    )
    rows = got["workloads"]
    assert got["rtol"] == RTOL
    assert rows["multi-krum"]["fedfaas"] == [] and rows["multi-krum"]["objstore-agg"] == ["krum"]
    assert rows["leave-one-out"]["fedfaas"] == []
    assert rows["shapley"]["checked"] == ["v_empty", "v_full"]
    assert rows["shapley"]["fedfaas"] == ["v_empty", "v_full"]  # not the job's utilities
    assert "cache-agg" not in rows["multi-krum"]
