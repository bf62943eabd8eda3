"""Provenance, clustering, personalization, Oort scheduling, tracking and model evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.cluster import KMeans

from flstore_workloads import TorchEvaluator, WorkloadData, flatten_module, get, load_flat

from .test_workloads_common import evaluator, frozen, model, three_rounds, validation

# -- provenance -----------------------------------------------------------------------------------


def test_provenance_shares_sum_to_one_and_match_brute_force() -> None:
    fed = three_rounds()
    res = get("provenance").run(fed.workload_data(), {"first_round": 1, "last_round": 3})
    assert res["share_sum"] == pytest.approx(1.0, abs=1e-6)
    assert res["residual"] < 1e-6  # the stored globals are the FedAvg of the stored updates
    change = fed.globals[3].astype(np.float64) - fed.globals[0]
    for c in fed.names:
        contrib = np.zeros_like(change)
        for r in (1, 2, 3):
            if c in fed.updates[r]:
                n = {k: float(m["n_samples"]) for k, m in fed.client_meta[r].items()}
                contrib += (
                    n[c]
                    / sum(n.values())
                    * (fed.updates[r][c].astype(np.float64) - fed.globals[r - 1])
                )
        assert res["shares"][c] == pytest.approx(contrib @ change / (change @ change), rel=1e-9)


def test_provenance_of_one_client_needs_only_its_updates_and_the_rounds_metadata() -> None:
    fed = three_rounds()
    full = get("provenance").run(fed.workload_data(), {"first_round": 1, "last_round": 3})
    only_c05 = WorkloadData(
        updates={r: {"c05": fed.updates[r]["c05"]} for r in (1, 3)},  # c05 skipped round 2
        globals=fed.globals,
        client_meta=fed.client_meta,
    )
    res = get("provenance").run(
        only_c05, {"first_round": 1, "last_round": 3, "clients": ["c05"], "lineage": True}
    )
    assert res["shares"]["c05"] == pytest.approx(full["shares"]["c05"], rel=1e-12)
    assert [row["round"] for row in res["lineage"]] == [1, 3] and "residual" not in res


# -- clustering and personalization ----------------------------------------------------------------


def planted(seed: int = 0) -> tuple[WorkloadData, list[int]]:
    rng = np.random.default_rng(seed)
    base = frozen(rng.normal(size=3000))
    centers = rng.normal(size=(3, 3000))
    truth = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    updates = {
        f"k{i:02d}": frozen(base + centers[t] + 0.2 * rng.normal(size=3000))
        for i, t in enumerate(truth)
    }
    meta = {c: {"n_samples": 10 + i} for i, c in enumerate(updates)}
    return WorkloadData(updates={1: updates}, globals={0: base}, client_meta={1: meta}), truth


def partition(labels: list[int]) -> set[frozenset[int]]:
    return {frozenset(i for i, x in enumerate(labels) if x == lab) for lab in set(labels)}


def test_kmeans_recovers_planted_clusters_and_picks_k_by_silhouette() -> None:
    data, truth = planted()
    res = get("kmeans").run(data, {"round": 1})
    assert res["k"] == 3
    assert partition(list(res["labels"].values())) == partition(truth)
    assert res["silhouette"] > 0.8
    u = np.stack([x.astype(np.float64) - data.globals[0] for x in data.updates[1].values()])
    ref = KMeans(n_clusters=3, n_init=10, random_state=0).fit(u)
    assert res["inertia"] == pytest.approx(
        ref.inertia_, rel=1e-6
    )  # same as k-means on the raw updates


def test_personalization_mixes_only_the_clients_own_cluster() -> None:
    data, truth = planted()
    clients = sorted(data.updates[1])
    for method in ("cluster", "similarity"):
        res = get("personalize").run(
            data, {"round": 1, "client": "k00", "method": method, "k": 3, "top_k": 4}
        )
        peers = set(res["coefficients"])
        assert peers == {c for c, t in zip(clients, truth, strict=True) if t == truth[0]}
        assert sum(res["coefficients"].values()) == pytest.approx(1.0)
        assert res["global"]["coefficient"] == 0.0


def test_personalization_picks_alpha_on_the_evaluator() -> None:
    data, _ = planted()
    target = data.updates[1]["k00"]
    data.globals = {0: data.globals[0], 1: frozen(np.zeros_like(target))}
    data.evaluator = lambda p: -float(np.linalg.norm(p - 0.5 * target))  # best at alpha ~ 0.5
    res = get("personalize").run(data, {"round": 1, "client": "k00", "alpha": None, "top_k": 1})
    assert res["alpha"] == 0.5 and res["coefficients"] == {"k00": 0.5}


# -- Oort -------------------------------------------------------------------------------------------


def oort_data() -> WorkloadData:
    meta = {
        2: {"b": {"n_samples": 50, "loss_sq_mean": 1.0, "duration_s": 30.0}},
        3: {"c": {"n_samples": 200, "losses": [0.5, -0.5, 0.5, 0.5], "duration_s": 20.0}},
        4: {"a": {"n_samples": 100, "loss_sq_mean": 4.0, "duration_s": 10.0}},
    }
    return WorkloadData(client_meta=meta)


def test_oort_scores_and_ranks_as_the_formula_says_on_a_hand_case() -> None:
    res = get("oort").run(
        oort_data(),
        {
            "round": 5,
            "k": 1,
            "deadline_s": 20.0,
            "clip_bound": 1.0,
            "exploration": 0.0,
            "cut_off": 1.0,
        },
    )
    # U = n * sqrt(mean loss^2): a 200, b 50, c 100; U_min 50, range 150; L = last round picked.
    bonus = {c: math.sqrt(0.1 * math.log(5) / last) for c, last in (("a", 4), ("b", 2), ("c", 3))}
    want = {
        "a": 1.0 + bonus["a"],
        "b": (0.0 + bonus["b"]) * (20 / 30) ** 2,
        "c": 50 / 150 + bonus["c"],
    }
    assert res["utility"] == pytest.approx({"a": 200.0, "b": 50.0, "c": 100.0})
    assert res["scores"] == pytest.approx(want, rel=1e-12)
    assert res["ranking"] == ["a", "c", "b"] and res["selected"] == ["a"]


def test_oort_defaults_the_deadline_to_the_30th_percentile_and_explores_new_clients() -> None:
    res = get("oort").run(
        oort_data(), {"round": 5, "k": 2, "candidates": ["a", "b", "c", "new"], "exploration": 0.5}
    )
    assert res["deadline_s"] == 10.0  # sorted durations [10, 20, 30], index int(3 * 0.3) = 0
    assert res["explored"] == ["new"] and len(res["exploited"]) == 1 and len(res["selected"]) == 2
    assert res["exploration"] == 0.5
    default = get("oort").run(oort_data(), {"round": 5, "k": 1})
    assert default["exploration"] == pytest.approx(max(0.9 * 0.98**5, 0.3))


# -- tracking -----------------------------------------------------------------------------------------


def test_tracking_reports_series_config_changes_and_a_plateau() -> None:
    losses = [2.0, 1.5, 1.2, 1.0, 0.995, 0.998, 0.996]
    rm = {
        r + 1: {
            "loss": x,
            "accuracy": 0.5 + r / 20,
            "lr": 0.1 if r < 3 else 0.05,
            "batch_size": 32,
            "selected": ["a", "b"],
        }
        for r, x in enumerate(losses)
    }
    cm = {r: {"a": {"loss": 1.0, "duration_s": 2.0}} for r in rm}
    res = get("track").run(WorkloadData(round_meta=rm, client_meta=cm), {"round": 7, "window": 10})
    assert res["rounds"] == list(range(1, 8)) and res["series"]["loss"] == losses
    assert res["config_changes"] == [{"round": 4, "key": "lr", "from": 0.1, "to": 0.05}]
    assert res["plateau"] is True and res["diverging"] is False
    assert res["suggestion"] == {"lr": pytest.approx(0.005)}
    assert res["clients"]["a"]["participations"] == 7


def test_tracking_detects_divergence_and_keeps_the_answer_json_safe() -> None:
    import json

    rm = {1: {"loss": 1.0}, 2: {"loss": 0.8}, 3: {"loss": 1.5}, 4: {"loss": float("nan")}}
    res = get("track").run(WorkloadData(round_meta=rm), {"round": 4, "window": 4})
    assert res["diverging"] is True and any("not finite" in r for r in res["reasons"])
    json.dumps(res, allow_nan=False)
    rising = {1: {"loss": 1.0}, 2: {"loss": 1.1}, 3: {"loss": 1.2}, 4: {"loss": 1.3}}
    assert get("track").run(WorkloadData(round_meta=rising), {"round": 4})["diverging"] is True


# -- evaluation ----------------------------------------------------------------------------------------


def test_evaluate_reports_the_validation_accuracy_of_the_global_and_of_a_client() -> None:
    fed = three_rounds()
    res = get("evaluate").run(fed.workload_data(with_evaluator=True), {"round": 3})
    x, y = validation()
    net = model()
    load_flat(net, fed.globals[3])
    import torch

    with torch.no_grad():
        acc = float((net(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    assert res["metrics"]["accuracy"] == pytest.approx(acc) and res["metrics"]["accuracy"] > 0.7
    client = get("evaluate").run(
        fed.workload_data(with_evaluator=True), {"round": 2, "client": "c01"}
    )
    assert client["model"] == "c01" and client["metrics"]["n"] == 300.0


def test_torch_evaluator_round_trips_a_read_only_vector_without_writing_it() -> None:
    net = model()
    flat = frozen(flatten_module(net) + 1.0)
    before = flat.copy()
    ev = TorchEvaluator(net, *validation())
    ev(flat)
    np.testing.assert_array_equal(flatten_module(net), flat)
    np.testing.assert_array_equal(flat, before)
    assert not flat.flags.writeable and ev.calls == 1
    assert isinstance(evaluator()(flat), float)


def test_load_flat_accepts_parameters_only_vectors_for_modules_with_buffers() -> None:
    import torch

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    params_only = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()]) + 2.0
    load_flat(net, frozen(params_only))
    np.testing.assert_allclose(
        np.concatenate([p.detach().numpy().ravel() for p in net.parameters()]), params_only
    )
    full = flatten_module(
        net
    )  # parameters and running statistics (num_batches_tracked is an int: skipped)
    assert full.shape[0] == params_only.shape[0] + 6
    load_flat(net, frozen(full + 1.0))
    np.testing.assert_allclose(flatten_module(net), full + 1.0)
    from flstore_workloads import DataMismatch

    with pytest.raises(DataMismatch, match="hold 27 values \\(21 in parameters alone\\)"):
        load_flat(net, frozen(np.zeros(5)))
