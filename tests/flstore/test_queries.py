"""Pure tests of query parsing and planning (what a query needs, and why it is refused)."""

from __future__ import annotations

import pytest

from cache_engine.catalog import MemoryCatalog
from cache_engine.keys import global_model, meta, update
from cache_engine.queries import (
    BadParams,
    Query,
    RoundNotWritten,
    UnknownClient,
    UnknownJob,
    parse_query,
    plan,
)


@pytest.fixture()
def cat() -> MemoryCatalog:
    c = MemoryCatalog()
    c.add_round("j", 0, [])
    for r in (1, 2, 3):
        c.add_round("j", r, ["a", "b", "c"])
    return c


def test_round_workload_needs_all_updates_of_the_round_and_the_previous_global(
    cat: MemoryCatalog,
) -> None:
    p = plan(Query("multi-krum", "j", [2], [], {"f": 1}), cat)
    assert p.policy == "P2"
    assert set(p.keys) == {update("j", c, 2) for c in "abc"} | {global_model("j", 1)}
    assert p.params["round"] == 2


def test_cross_round_workload_maps_to_p3_and_spans_rounds(cat: MemoryCatalog) -> None:
    p = plan(Query("foolsgold", "j", [], [], {"first_round": 1, "last_round": 3}), cat)
    assert p.policy == "P3"
    assert {k.round for k in p.keys if k.kind == "update"} == {1, 2, 3}


def test_metadata_workload_needs_only_metadata(cat: MemoryCatalog) -> None:
    p = plan(Query("track", "j", [3], [], {"window": 2}), cat)
    assert p.policy == "P4"
    assert set(p.keys) <= {meta("j", r) for r in (1, 2, 3)}


def test_single_client_fills_the_client_parameter(cat: MemoryCatalog) -> None:
    p = plan(Query("personalize", "j", [2], ["b"], {}), cat)
    assert p.params["client"] == "b"


@pytest.mark.parametrize(
    ("q", "exc"),
    [
        (Query("multi-krum", "nojob", [1]), UnknownJob),
        (Query("multi-krum", "j", [7]), RoundNotWritten),
        (Query("multi-krum", "j", [1], ["a", "zz"]), UnknownClient),
        (Query("personalize", "j", [1], ["zz"]), UnknownClient),
        (Query("multi-krum", "j", [1, 2]), BadParams),
        (Query("multi-krum", "../etc", [1]), BadParams),
    ],
)
def test_bad_queries_are_refused_with_the_fact(cat: MemoryCatalog, q: Query, exc: type) -> None:
    with pytest.raises(exc) as info:
        plan(q, cat)
    assert info.value.to_dict()["detail"]


def test_unknown_workload_and_bad_params_come_from_the_workload_registry(
    cat: MemoryCatalog,
) -> None:
    from flstore_workloads import InvalidParams, UnknownWorkload

    with pytest.raises(UnknownWorkload):
        plan(Query("nope", "j", [1]), cat)
    with pytest.raises(InvalidParams):
        plan(Query("multi-krum", "j", [1], [], {"f": "many"}), cat)


@pytest.mark.parametrize(
    "body",
    [
        {"job": "j"},
        {"workload": "x"},
        {"workload": "x", "job": "j", "rounds": [-1]},
        {"workload": "x", "job": "j", "rounds": [True]},
        {"workload": "x", "job": "j", "params": []},
        {"workload": "x", "job": "j", "clients": ["a b"]},
        {"workload": "x", "job": "j", "zz": 1},
    ],
)
def test_malformed_query_bodies_are_refused(body: dict) -> None:
    with pytest.raises(BadParams):
        parse_query(body)


def test_scalar_round_and_client_are_accepted() -> None:
    q = parse_query({"workload": "x", "job": "j", "rounds": 3, "clients": "a"})
    assert q.rounds == [3] and q.clients == ["a"]


def test_meta_json_of_every_writer_is_read_the_same_way() -> None:
    from cache_engine.cold_store import normalize_meta

    gateway = normalize_meta(
        {
            "job": "j",
            "round": 3,
            "version": 3,
            "count": 2,
            "weight_sum": 30.0,
            "clients": {"a": 10.0, "b": 20.0},
        }
    )
    demo = normalize_meta(
        {
            "round": 3,
            "accuracy": 0.9,
            "loss": 0.3,
            "seconds": 1.5,
            "clients": [
                {"client": "a", "node": "n0", "num_samples": 10},
                {"client": "b", "node": "n1", "num_samples": 20},
            ],
        }
    )
    ours = normalize_meta(
        {
            "round": 3,
            "clients": ["a", "b"],
            "client_meta": {"a": {"n_samples": 10}, "b": {"n_samples": 20}},
            "round_meta": {"accuracy": 0.9},
        }
    )
    for m in (gateway, demo, ours):
        assert m["clients"] == ["a", "b"]
        assert m["client_meta"]["b"]["n_samples"] == 20
    assert demo["round_meta"]["duration_s"] == 1.5 and demo["round_meta"]["accuracy"] == 0.9
    assert gateway["round_meta"]["weight_sum"] == 30.0
