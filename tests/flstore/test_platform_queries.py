"""The round metadata the node gateways write is what FLStore's workloads read: each client's
``X-Client-Meta`` becomes its ``client_meta`` (beside ``n_samples``), the job's declared
evaluator its ``round_meta``, and Oort schedules from it. Pure: no services."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cache_engine.cold_store import MemoryColdStore
from cache_engine.keys import meta
from cache_engine.queries import run_workload
from flstore_workloads.errors import MissingData
from gateway.meta import round_meta_doc

EVALUATOR = {"kind": "digits-softmax", "split_seed": 0}


def _records(rnd: int, silent: tuple[str, ...] = ("c3",)) -> dict[str, dict[str, Any]]:
    """Journal records as the gateway keeps them: c2 is slow, ``silent`` sent no metadata."""
    out: dict[str, dict[str, Any]] = {}
    for i, c in enumerate(["c0", "c1", "c2", "c3"]):
        rec: dict[str, Any] = {"key": f"{i:032x}", "weight": 10 * (i + 1), "node": "node0"}
        if c not in silent:
            rec["meta"] = {
                "loss": 0.5 + i + 0.1 * rnd,
                "loss_sq_mean": (0.5 + i) ** 2,
                "duration_s": 30.0 if c == "c2" else 1.0 + i,
            }
        out[c] = rec
    return out


def _written(rounds: range, silent: tuple[str, ...] = ("c3",)) -> MemoryColdStore:
    cold = MemoryColdStore()
    for r in rounds:
        doc = round_meta_doc("job", r, r, 4, 100.0, _records(r, silent), EVALUATOR)
        cold.put_bytes(meta("job", r), json.dumps(doc).encode())
    return cold


def test_gateway_round_meta_reads_as_client_meta_and_round_meta() -> None:
    got = _written(range(1, 2)).round_meta("job", 1)
    assert got["clients"] == ["c0", "c1", "c2", "c3"]
    assert got["client_meta"]["c0"] == {
        "loss": 0.6,
        "loss_sq_mean": 0.25,
        "duration_s": 1.0,
        "n_samples": 10,
    }
    assert got["client_meta"]["c3"] == {"n_samples": 40}
    assert got["round_meta"]["evaluator"] == EVALUATOR
    assert got["round_meta"]["weight_sum"] == 100.0


def test_oort_schedules_from_what_the_gateways_wrote() -> None:
    cold = _written(range(1, 3), silent=())
    objects = {meta("job", r): cold.round_meta("job", r) for r in (1, 2)}
    res = run_workload("oort", {"round": 3, "k": 2, "exploration": 0.0}, objects)
    assert len(res["selected"]) == 2
    assert set(res["utility"]) == {"c0", "c1", "c2", "c3"}
    assert "c2" not in res["selected"], "the straggler is penalised"


def test_oort_says_which_client_sent_no_duration() -> None:
    cold = _written(range(1, 3))
    objects = {meta("job", r): cold.round_meta("job", r) for r in (1, 2)}
    with pytest.raises(MissingData) as err:
        run_workload("oort", {"round": 3, "k": 2}, objects)
    assert err.value.to_dict()["error"] == "missing_data"
    assert "c3" in str(err.value) and "duration_s" in str(err.value)
