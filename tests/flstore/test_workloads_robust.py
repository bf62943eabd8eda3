"""Malicious-client filtering on real updates: cosine to the aggregate, Multi-Krum, FoolsGold."""

from __future__ import annotations

import numpy as np
import pytest

from flstore_workloads import WorkloadData, get
from flstore_workloads._linalg import cosines, distances, gram
from flstore_workloads.robust import cosine_to_aggregate, foolsgold_weights, krum_scores

from .test_workloads_common import attacked_round, frozen, sybil_run


def test_streaming_gram_matches_explicit_products_across_chunk_boundaries() -> None:
    rng = np.random.default_rng(0)
    base = frozen(rng.normal(size=1001))
    ws = [frozen(rng.normal(size=1001)) for _ in range(4)]
    rows = [[(1.0, w), (-1.0, base)] for w in ws] + [[(0.5, ws[0]), (0.25, ws[1]), (-0.75, base)]]
    got = gram(rows, chunk=64)  # 1001 is not a multiple of 64: exercises the ragged last chunk
    u = np.stack([w.astype(np.float64) - base for w in ws])
    w64 = [w.astype(np.float64) for w in ws]
    u = np.vstack([u, 0.5 * w64[0] + 0.25 * w64[1] - 0.75 * base.astype(np.float64)])
    np.testing.assert_allclose(got, u @ u.T, rtol=1e-12, atol=1e-9)


def test_sign_and_label_flippers_have_the_lowest_cosine_to_the_aggregate() -> None:
    fed = attacked_round()
    res = get("cosine-to-aggregate").run(fed.workload_data(), {"round": 1, "bottom_k": 2})
    assert set(res["flagged"]) == {"c08", "c09"}
    assert res["ranking"][0] == "c09" and res["cosine"]["c09"] < 0  # the sign flipper points away
    honest = [v for c, v in res["cosine"].items() if c not in ("c08", "c09")]
    assert min(honest) > 0.5 > res["cosine"]["c08"]


def test_cosine_to_aggregate_matches_explicit_vectors_and_threshold_flags() -> None:
    fed = attacked_round()
    data = fed.workload_data()
    res = get("cosine-to-aggregate").run(data, {"round": 1, "bottom_k": 0, "threshold": 0.5})
    assert set(res["flagged"]) == {"c08", "c09"}
    clients = sorted(fed.updates[1])
    u = np.stack([fed.updates[1][c].astype(np.float64) - fed.globals[0] for c in clients])
    n = np.array([fed.client_meta[1][c]["n_samples"] for c in clients], dtype=float)
    a = (n / n.sum()) @ u
    want = u @ a / (np.linalg.norm(u, axis=1) * np.linalg.norm(a))
    np.testing.assert_allclose([res["cosine"][c] for c in clients], want, rtol=1e-9)


def test_multi_krum_rejects_the_two_attackers_and_scores_match_brute_force() -> None:
    fed = attacked_round()
    res = get("multi-krum").run(fed.workload_data(), {"round": 1, "f": 2})
    assert set(res["flagged"]) == {"c08", "c09"} and len(res["selected"]) == 8
    clients = sorted(fed.updates[1])
    u = [fed.updates[1][c].astype(np.float64) - fed.globals[0] for c in clients]
    for i, c in enumerate(clients):
        d = sorted(float(np.sum((u[i] - u[j]) ** 2)) for j in range(len(u)) if j != i)
        assert res["scores"][c] == pytest.approx(sum(d[: len(u) - 2 - 2]), rel=1e-9)
    assert res["krum"] == min(res["scores"], key=res["scores"].get)


def test_foolsgold_zeroes_sybils_that_share_an_objective_and_keeps_honest_clients() -> None:
    fed = sybil_run()
    res = get("foolsgold").run(fed.workload_data(), {"first_round": 1, "last_round": 3})
    assert set(res["flagged"]) == {"lf0", "lf1", "sf0", "sf1"}
    assert all(res["weights"][s] == 0.0 for s in ("lf0", "lf1", "sf0", "sf1"))
    assert all(res["weights"][h] > 0.5 for h in ("h00", "h01", "h02", "h03", "h04", "h05"))


def test_foolsgold_weights_follow_the_reference_steps_on_a_hand_case() -> None:
    cs = np.array([[1.0, 0.9, 0.1], [0.9, 1.0, 0.2], [0.1, 0.2, 1.0]])
    # v = max off-diagonal = [0.9, 0.9, 0.2]; pardoning only touches cs[2, j] where v_j > v_2:
    # cs[2,0] = 0.1 * 0.2 / 0.9, cs[2,1] = 0.2 * 0.2 / 0.9; alpha = 1 - max = [0.1, 0.1, 1 - 0.04/0.9]
    alpha = np.array([0.1, 0.1, 1 - 0.04 / 0.9])
    alpha = alpha / alpha.max()
    alpha[alpha >= 1] = 0.99
    want = np.clip(np.log(alpha / (1 - alpha)) + 0.5, 0, 1)
    np.testing.assert_allclose(foolsgold_weights(cs), want, rtol=1e-12)


def test_pure_helpers_agree_with_brute_force_on_random_vectors() -> None:
    rng = np.random.default_rng(3)
    u = rng.normal(size=(6, 50))
    g = u @ u.T
    d2 = distances(g)
    brute = ((u[:, None, :] - u[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(d2, brute, atol=1e-9)
    np.testing.assert_allclose(
        cosines(g), g / np.outer(np.linalg.norm(u, axis=1), np.linalg.norm(u, axis=1))
    )
    p = np.full(6, 1 / 6)
    a = p @ u
    np.testing.assert_allclose(
        cosine_to_aggregate(g, p), u @ a / np.linalg.norm(u, axis=1) / np.linalg.norm(a)
    )
    s = krum_scores(d2, f=1)
    np.testing.assert_allclose(s, [np.sort(np.delete(brute[i], i))[:3].sum() for i in range(6)])


def test_updates_given_as_deltas_give_the_same_answer_as_weights_with_a_base() -> None:
    fed = attacked_round()
    deltas = {
        1: {c: frozen(w.astype(np.float64) - fed.globals[0]) for c, w in fed.updates[1].items()}
    }
    as_deltas = WorkloadData(updates=deltas, client_meta=fed.client_meta, updates_are_deltas=True)
    a = get("multi-krum").run(as_deltas, {"round": 1, "f": 2})
    b = get("multi-krum").run(fed.workload_data(), {"round": 1, "f": 2})
    assert a["selected"] == b["selected"]
    np.testing.assert_allclose(list(a["scores"].values()), list(b["scores"].values()), rtol=1e-5)
