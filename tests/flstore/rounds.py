"""Shared pieces of the tests of rounds larger than one cache function: the jobs written to
MinIO, the queries asked of them, and the in-process reference they are compared with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.flstore_stack import FLStoreStack
from bench.harness.synthetic import History, write_digits_history, write_history
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import MinioColdStore
from cache_engine.evaluators import build_evaluator
from cache_engine.queries import Query, plan, run_workload

JOB, DIGITS = "parts-job", "parts-digits"
SHAPES = {"a.weight": (64, 32), "b.weight": (2048,)}  # 4,096 floats: 16 KiB


def direct(cold: MinioColdStore, body: dict[str, Any]) -> dict[str, Any]:
    """The workload in this process on the whole vectors from MinIO."""
    job = body["job"]
    cat = MemoryCatalog()
    for r in cold.rounds(job):
        cat.add_round(job, r, cold.round_meta(job, r)["clients"])
    rounds, clients = body.get("rounds", []), body.get("clients", [])
    q = Query(body["workload"], job, rounds, clients, body.get("params", {}))
    p = plan(q, cat)
    spec = cold.round_meta(job, 0)["round_meta"].get("evaluator")
    ev = build_evaluator(spec) if p.evaluator else None
    return run_workload(p.query.workload, p.params, {k: cold.get(k) for k in p.keys}, ev)


def same(got: dict[str, Any], want: dict[str, Any], rel: float = 1e-6) -> None:
    """Equal answers: the same lists, numbers within ``rel`` (float32 parts vs whole)."""
    assert got.keys() == want.keys()
    for k, w in want.items():
        g = got[k]
        if isinstance(w, dict):
            same(g, w, rel)
        elif isinstance(w, float):
            assert g == pytest.approx(w, rel=rel, abs=1e-9), k
        else:
            assert g == w, k


QUERIES = [
    {"workload": "cosine-to-aggregate", "job": JOB, "rounds": [2], "params": {"bottom_k": 1}},
    {"workload": "multi-krum", "job": JOB, "rounds": [2], "params": {"f": 2}},
    {"workload": "foolsgold", "job": JOB, "params": {"first_round": 1, "last_round": 2}},
    {"workload": "leave-one-out", "job": DIGITS, "rounds": [2]},
    {"workload": "shapley", "job": DIGITS, "rounds": [2], "params": {"max_permutations": 60}},
]


def write_jobs(cold: MinioColdStore, tag: str) -> tuple[History, History]:
    h = write_history(
        cold, JOB + tag, 2, per_round=12, pool=30, shapes=SHAPES, malicious=["c005"], seed=3
    )
    d = write_digits_history(cold, DIGITS + tag, 2, per_round=30, pool=60, flip=["c001"])
    return h, d


def bodies(tag: str) -> list[dict[str, Any]]:
    return [{**q, "job": q["job"] + tag} for q in QUERIES]


def state(stack: FLStoreStack) -> dict[str, Any]:
    return httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()


def engine_log(stack: FLStoreStack) -> str:
    return (Path(stack.workdir) / "logs" / "engine.log").read_text(errors="replace")
