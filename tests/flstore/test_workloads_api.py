"""The registry contract the cache function and request tracker rely on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flstore_workloads import (
    WORKLOADS,
    InvalidParams,
    MissingData,
    UnknownWorkload,
    Workload,
    WorkloadData,
    WorkloadError,
    get,
)

from .test_workloads_common import attacked_round, frozen

EXPECTED = {
    "cosine-to-aggregate",
    "multi-krum",
    "foolsgold",
    "leave-one-out",
    "shapley",
    "incentives",
    "oort",
    "kmeans",
    "personalize",
    "provenance",
    "track",
    "evaluate",
}


def test_registry_lists_every_workload_with_a_policy_and_a_json_schema() -> None:
    assert set(WORKLOADS) == EXPECTED
    for name, w in WORKLOADS.items():
        assert isinstance(w, Workload) and w.name == name and w.policy in ("P1", "P2", "P3", "P4")
        json.dumps(w.describe())


def test_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(UnknownWorkload) as err:
        get("shapely")
    assert "shapley" in err.value.detail and err.value.to_dict()["error"] == "unknown_workload"


@pytest.mark.parametrize(
    ("name", "params", "field", "words"),
    [
        ("multi-krum", {"round": 0}, "round", "greater than or equal to 1"),
        ("multi-krum", {"round": 1, "f": -1}, "f", "greater than or equal to 0"),
        (
            "cosine-to-aggregate",
            {"round": 1, "bottom": 2},
            "bottom",
            "Extra inputs are not permitted",
        ),
        ("cosine-to-aggregate", {"round": 1, "clients": ["a", "a"]}, "clients", "unique"),
        ("shapley", {"round": 1, "method": "banzhaf"}, "method", "'gtg', 'tmc' or 'exact'"),
        ("foolsgold", {"first_round": 3, "last_round": 2}, "(params)", "must be >= first_round"),
        ("kmeans", {}, "round", "Field required"),
        ("oort", {"round": 5, "k": 0}, "k", "greater than or equal to 1"),
    ],
)
def test_bad_params_raise_invalid_params_naming_the_field(
    name: str, params: dict, field: str, words: str
) -> None:
    with pytest.raises(InvalidParams) as err:
        get(name).parse(params)
    e = err.value
    assert isinstance(e, WorkloadError) and e.workload == name
    assert any(p["field"] == field and words in p["problem"] for p in e.errors), e.errors
    body = e.to_dict()
    assert body["error"] == "invalid_params" and field in body["detail"]
    json.dumps(body)


def test_params_that_do_not_fit_the_data_are_invalid_params_with_the_facts() -> None:
    data = attacked_round().workload_data()
    with pytest.raises(InvalidParams) as err:
        get("multi-krum").run(data, {"round": 1, "f": 8})
    assert "n >= f + 3" in err.value.detail and "n=10" in err.value.detail
    with pytest.raises(InvalidParams, match="bottom_k"):
        get("cosine-to-aggregate").run(data, {"round": 1, "bottom_k": 11})


def test_missing_round_client_or_global_is_missing_data_with_the_facts() -> None:
    fed = attacked_round()
    with pytest.raises(MissingData) as err:
        get("multi-krum").run(fed.workload_data(), {"round": 2})
    assert (
        err.value.kind == "updates" and err.value.round == 2 and err.value.workload == "multi-krum"
    )
    with pytest.raises(MissingData) as err:
        get("kmeans").run(fed.workload_data(), {"round": 1, "clients": ["c00", "zz"], "k": 1})
    assert err.value.clients == ("zz",)
    no_base = WorkloadData(updates=fed.updates, client_meta=fed.client_meta)
    with pytest.raises(MissingData) as err:
        get("cosine-to-aggregate").run(no_base, {"round": 1})
    assert (
        err.value.kind == "global" and err.value.round == 0 and "globals[r-1]" in err.value.detail
    )


def test_requirements_map_each_query_to_its_policy_and_keys() -> None:
    r = get("multi-krum").requirements({"round": 7, "clients": ["a", "b", "c"]})
    assert (r.policy, r.update_rounds, r.clients, r.global_versions) == (
        "P2",
        (7,),
        ("a", "b", "c"),
        (6,),
    )
    r = get("provenance").requirements({"first_round": 2, "last_round": 4, "clients": ["a"]})
    assert r.policy == "P3" and r.update_rounds == (2, 3, 4) and r.global_versions == (1, 2, 3, 4)
    r = get("oort").requirements({"round": 12, "k": 3})
    assert r.policy == "P4" and r.client_meta_rounds == tuple(range(2, 12)) and not r.update_rounds
    r = get("evaluate").requirements({"round": 5})
    assert r.policy == "P1" and r.global_versions == (5,) and r.evaluator
    json.dumps(r.to_dict())


def test_every_update_workload_answers_in_strict_json_and_never_writes_its_inputs() -> None:
    fed = attacked_round()
    data = fed.workload_data()
    before = {c: np.array(v) for c, v in fed.updates[1].items()}
    queries = {
        "cosine-to-aggregate": {"round": 1},
        "multi-krum": {"round": 1},
        "foolsgold": {"first_round": 1, "last_round": 1},
        "kmeans": {"round": 1, "k": 2},
        "personalize": {"round": 1, "client": "c00"},
        "provenance": {"first_round": 1, "last_round": 1, "lineage": True},
    }
    for name, q in queries.items():
        out = get(name).run(data, q)
        assert out["workload"] == name
        json.dumps(out, allow_nan=False)
    for c, v in fed.updates[1].items():
        assert not v.flags.writeable
        np.testing.assert_array_equal(v, before[c])
    assert frozen(np.zeros(2)).flags.writeable is False


def test_exact_shapley_refuses_too_many_clients_and_personalize_an_absent_client() -> None:
    vecs = {f"x{i:02d}": frozen(np.full(4, float(i))) for i in range(15)}
    data = WorkloadData(
        updates={1: vecs},
        globals={0: frozen(np.zeros(4))},
        client_meta={1: {c: {"n_samples": 1} for c in vecs}},
        evaluator=lambda p: float(p.sum()),
    )
    with pytest.raises(InvalidParams, match="2\\^n coalitions; n=15"):
        get("shapley").run(data, {"round": 1, "method": "exact"})
    with pytest.raises(InvalidParams, match="client"):
        get("personalize").run(data, {"round": 1, "client": "nobody"})
