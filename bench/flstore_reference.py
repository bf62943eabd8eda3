"""An independent reference for FLStore's answers, for the benchmarks' same-answer check.

The FLStore bench compares FedFaaS's cache functions with ObjStore-Agg, and both run
:mod:`flstore_workloads`: equal answers there show that the same objects reached the same code,
not that the code is right. This module computes the same answers a second way, written from
the papers and the workloads' documented definitions (``flstore_workloads/README.md``), without
importing :mod:`fedfaas`: plain numpy in float64 over the ``n x d`` matrix of the updates
(no Gram matrix, no streaming), scikit-learn's ``cosine_similarity``, ``KMeans`` and
``silhouette_samples`` on the raw updates (the workload clusters an ``n x n`` embedding of
their Gram matrix), and coalition utilities by enumeration.

- ``cosine-to-aggregate``: ``cos(Delta_i, sum_j p_j Delta_j)``, ``p`` the samples' (or uniform)
  weights, ``Delta_i = w_i - g_{r-1}``; ranking ascending.
- ``multi-krum`` (Blanchard et al. 2017): a client's score is the sum of its squared distances
  to its ``n - f - 2`` nearest other clients; Krum is the lowest, Multi-Krum the ``m`` lowest.
- ``foolsgold`` (Fung et al. 2020, the authors' ``foolsgold`` function): cosine similarity of
  the clients' summed histories, the diagonal removed, pardoning, ``1 - max``, rescaling and the
  logit, step by step as in their code.
- ``kmeans``: scikit-learn's k-means++ on the updates themselves; ``k`` by the best mean
  silhouette in ``2..min(max_k, n - 1)`` when not given.
- ``leave-one-out`` and ``shapley`` (``method="exact"``): ``v(S) = evaluator(g + sum_{i in S}
  p_i / P_S Delta_i)``, ``v(empty) = evaluator(g)``; LOO ``v(N) - v(N \\ {i})``; Shapley by
  the definition, over every subset of the others (small ``n``). GTG-Shapley is Monte Carlo:
  compare it with :func:`exact_shapley` within its convergence tolerance.

:func:`reference_answer` dispatches on the workload's name and returns the keys of the
workload's answer that define it (:data:`KEYS`); :func:`agrees` compares a workload's answer
with it, floats relative to their vector's scale, integers and strings exactly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

Updates = Mapping[int, Mapping[str, NDArray[np.floating]]]
Meta = Mapping[int, Mapping[str, Mapping[str, Any]]]
Utility = Callable[[NDArray[np.float32]], float]

#: the keys of each workload's answer that the reference computes (the rest is bookkeeping)
KEYS: dict[str, tuple[str, ...]] = {
    "cosine-to-aggregate": ("cosine", "ranking", "flagged"),
    "multi-krum": ("scores", "krum", "selected", "flagged", "m"),
    "foolsgold": ("weights", "max_similarity", "flagged"),
    "kmeans": ("k", "labels", "clusters", "inertia", "silhouette", "silhouette_per_client"),
    "leave-one-out": ("values", "v_full"),
    "shapley": ("values", "sum", "v_empty", "v_full"),
}


# ----------------------------------------------------------------------------- inputs
def _clients(updates: Updates, r: int, clients: Sequence[str] | None) -> list[str]:
    return sorted(updates[r]) if clients is None else list(clients)


def deltas(updates: Updates, globals_: Mapping[int, NDArray[np.floating]], r: int,
           clients: Sequence[str]) -> NDArray[np.float64]:  # fmt: skip
    """The ``n x d`` float64 matrix of ``Delta_i = w_i - g_{r-1}``, one row per client."""
    g = np.asarray(globals_[r - 1], dtype=np.float64)
    return np.stack([np.asarray(updates[r][c], dtype=np.float64) - g for c in clients])


def weights(
    meta: Meta | None, r: int, clients: Sequence[str], weighting: str
) -> NDArray[np.float64]:
    """``p_i``: ``n_i / sum n`` (``"samples"``) or ``1 / n`` (``"uniform"``)."""
    if weighting == "uniform":
        return np.full(len(clients), 1.0 / len(clients))
    assert meta is not None, "weighting by samples needs client_meta"
    n = np.array([float(meta[r][c]["n_samples"]) for c in clients])
    return n / n.sum()


# ----------------------------------------------------------------------------- workloads
def cosine_to_aggregate(x: NDArray[np.float64], p: NDArray[np.float64]) -> NDArray[np.float64]:
    """``cos(x_i, sum_j p_j x_j)`` by scikit-learn's ``cosine_similarity``."""
    from sklearn.metrics.pairwise import cosine_similarity

    return np.asarray(cosine_similarity(x, (p @ x)[None, :])[:, 0], dtype=np.float64)


def krum_scores(x: NDArray[np.float64], f: int) -> NDArray[np.float64]:
    """Each row's sum of squared Euclidean distances to its ``n - f - 2`` nearest other rows,
    the distances from the coordinates (not from inner products)."""
    n = len(x)
    k = n - f - 2
    out = np.empty(n)
    for i in range(n):
        d2 = np.array([np.sum((x[i] - x[j]) ** 2) for j in range(n) if j != i])
        out[i] = np.sort(d2)[:k].sum()
    return out


def foolsgold(histories: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """FoolsGold's weights and each client's largest similarity to another, from the rows of
    summed updates, following the authors' function line by line (loops, not masks)."""
    from sklearn.metrics.pairwise import cosine_similarity

    n = len(histories)
    cs = cosine_similarity(histories) - np.eye(n)
    max_similarity = np.array([np.max(np.delete(cs[i], i)) for i in range(n)])
    maxcs = np.max(cs, axis=1)
    for i in range(n):  # pardoning
        for j in range(n):
            if i != j and maxcs[i] < maxcs[j]:
                cs[i][j] = cs[i][j] * maxcs[i] / maxcs[j]
    wv = 1 - np.max(cs, axis=1)
    wv[wv > 1] = 1
    wv[wv < 0] = 0
    wv = wv / np.max(wv)
    wv[wv == 1] = 0.99
    with np.errstate(divide="ignore"):
        wv = np.log(wv / (1 - wv)) + 0.5
    wv[(np.isinf(wv) + wv) > 1] = 1
    wv[wv < 0] = 0
    return wv, max_similarity


def kmeans(x: NDArray[np.float64], k: int, seed: int, n_init: int) -> tuple[list[int], float]:
    """scikit-learn's k-means++ on the rows; labels numbered by first appearance, inertia."""
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)
    order: dict[int, int] = {}
    for lab in km.labels_:
        order.setdefault(int(lab), len(order))
    return [order[int(lab)] for lab in km.labels_], float(km.inertia_)


def coalition_utility(
    evaluator: Utility, g: NDArray[np.float64], x: NDArray[np.float64], p: NDArray[np.float64]
) -> Callable[[tuple[int, ...]], float]:
    """``v(S)``: the evaluator on ``g + sum_{i in S} p_i / P_S x_i`` (float64, handed over as
    float32), ``v(()) = evaluator(g)``; memoised."""
    memo: dict[tuple[int, ...], float] = {}

    def v(s: tuple[int, ...]) -> float:
        if s not in memo:
            model = g.copy()
            if s:
                w = p[list(s)] / p[list(s)].sum()
                for coef, i in zip(w, s, strict=True):
                    model += coef * x[i]
            memo[s] = float(evaluator(model.astype(np.float32)))
        return memo[s]

    return v


def exact_shapley(v: Callable[[tuple[int, ...]], float], n: int) -> NDArray[np.float64]:
    """``phi_i = sum_{S of the others} |S|! (n - |S| - 1)! / n! (v(S + i) - v(S))``."""
    phi = np.zeros(n)
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for size in range(n):
            w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for s in itertools.combinations(others, size):
                phi[i] += w * (v(tuple(sorted((*s, i)))) - v(s))
    return phi


# ----------------------------------------------------------------------------- answers
def reference_answer(
    workload: str,
    params: Mapping[str, Any],
    updates: Updates,
    globals_: Mapping[int, NDArray[np.floating]],
    client_meta: Meta | None = None,
    evaluator: Utility | None = None,
) -> dict[str, Any]:
    """The reference's answer to ``workload`` with ``params`` over the data a
    :class:`flstore_workloads.WorkloadData` would hold (``updates[r][client]``: the trained
    weights, ``globals_[v]``: the model after round ``v``, ``client_meta[r][client]["n_samples"]``,
    ``evaluator``: utility of a flat model). Returns the keys :data:`KEYS` names for it.
    Supported: every workload of :data:`KEYS`; ``shapley`` with ``method="exact"`` only."""
    p = dict(params)
    if workload == "foolsgold":
        return _foolsgold(p, updates, globals_)
    r = int(p["round"])
    clients = _clients(updates, r, p.get("clients"))
    x = deltas(updates, globals_, r, clients)
    if workload == "cosine-to-aggregate":
        s = cosine_to_aggregate(x, weights(client_meta, r, clients, p.get("weighting", "samples")))
        order = sorted(range(len(clients)), key=lambda i: s[i])
        flagged = set(order[: int(p.get("bottom_k", 1))])
        if p.get("threshold") is not None:
            flagged |= {i for i in range(len(clients)) if s[i] < p["threshold"]}
        return {
            "cosine": {c: float(v) for c, v in zip(clients, s, strict=True)},
            "ranking": [clients[i] for i in order],
            "flagged": [clients[i] for i in order if i in flagged],
        }
    if workload == "multi-krum":
        f = int(p.get("f", 1))
        m = len(clients) - f if p.get("m") is None else int(p["m"])
        scores = krum_scores(x, f)
        order = sorted(range(len(clients)), key=lambda i: scores[i])
        return {
            "scores": {c: float(v) for c, v in zip(clients, scores, strict=True)},
            "krum": clients[order[0]],
            "selected": [clients[i] for i in order[:m]],
            "flagged": [clients[i] for i in order[m:]],
            "m": m,
        }
    if workload == "kmeans":
        return _kmeans(p, clients, x)
    if evaluator is None:
        raise ValueError(f"{workload} needs an evaluator")
    g = np.asarray(globals_[r - 1], dtype=np.float64)
    w = weights(client_meta, r, clients, p.get("weighting", "samples"))
    v = coalition_utility(evaluator, g, x, w)
    n = len(clients)
    full = v(tuple(range(n)))
    if workload == "leave-one-out":
        loo = [full - v(tuple(j for j in range(n) if j != i)) for i in range(n)]
        return {"values": dict(zip(clients, map(float, loo), strict=True)), "v_full": full}
    if workload == "shapley" and p.get("method") == "exact":
        phi = exact_shapley(v, n)
        return {
            "values": dict(zip(clients, map(float, phi), strict=True)),
            "sum": float(phi.sum()),
            "v_empty": v(()),
            "v_full": full,
        }
    raise ValueError(f"no reference for {workload} with {p}")


def _foolsgold(p: dict[str, Any], updates: Updates, globals_: Mapping[int, Any]) -> dict[str, Any]:
    rounds = range(int(p["first_round"]), int(p["last_round"]) + 1)
    seen = sorted({c for r in rounds for c in updates.get(r, {})})
    clients = seen if p.get("clients") is None else list(p["clients"])
    hist = np.zeros((len(clients), len(np.asarray(globals_[rounds[0] - 1]))))
    for i, c in enumerate(clients):
        for r in rounds:
            if c in updates.get(r, {}):
                hist[i] += np.asarray(updates[r][c], np.float64) - np.asarray(globals_[r - 1])
    wv, max_similarity = foolsgold(hist)
    below = float(p.get("flag_below", 0.5))
    return {
        "weights": {c: float(v) for c, v in zip(clients, wv, strict=True)},
        "max_similarity": {c: float(v) for c, v in zip(clients, max_similarity, strict=True)},
        "flagged": [clients[i] for i in sorted(range(len(clients)), key=lambda i: wv[i])
                    if wv[i] < below],
    }  # fmt: skip


def _kmeans(p: dict[str, Any], clients: list[str], x: NDArray[np.float64]) -> dict[str, Any]:
    from sklearn.metrics import silhouette_samples

    seed, n_init, n = int(p.get("seed", 0)), int(p.get("n_init", 10)), len(clients)

    def silhouette(labels: list[int]) -> NDArray[np.float64] | None:
        return silhouette_samples(x, labels) if 2 <= len(set(labels)) <= n - 1 else None

    if p.get("k") is not None:
        k = int(p["k"])
        labels, inertia = kmeans(x, k, seed, n_init)
    else:
        best: tuple[float, int, list[int], float] | None = None
        for kk in range(2, min(int(p.get("max_k", 8)), n - 1) + 1):
            lab, ine = kmeans(x, kk, seed, n_init)
            s = silhouette(lab)
            if s is not None and (best is None or float(s.mean()) > best[0]):
                best = (float(s.mean()), kk, lab, ine)
        assert best is not None, "no k gives a defined silhouette"
        _, k, labels, inertia = best
    sil = silhouette(labels)
    return {
        "k": k,
        "labels": dict(zip(clients, labels, strict=True)),
        "clusters": [[c for c, lab in zip(clients, labels, strict=True) if lab == j]
                     for j in range(k)],
        "inertia": inertia,
        "silhouette": None if sil is None else float(sil.mean()),
        "silhouette_per_client": None if sil is None
        else {c: float(s) for c, s in zip(clients, sil, strict=True)},
    }  # fmt: skip


def agrees(answer: Mapping[str, Any], reference: Mapping[str, Any], rtol: float) -> list[str]:
    """Where a workload's ``answer`` differs from the ``reference``: the keys of the reference
    whose values differ (empty: the same answer). Floats within ``rtol`` of their vector's
    largest magnitude (a dict's or a list's numbers are one vector; a lone float its own
    magnitude), integers, strings and lists of names exactly, key sets exactly."""
    return [k for k in reference if k not in answer or not _same(answer[k], reference[k], rtol)]


def _same(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return False
        keys = sorted(b)
        return _same([a[k] for k in keys], [b[k] for k in keys], rtol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return False
        if b and all(_float(x) for x in b):
            if not all(_number(y) for y in a):
                return False
            scale = max(max(abs(float(y)) for y in a), max(abs(float(x)) for x in b))
            return all(abs(float(y) - float(x)) <= rtol * scale for y, x in zip(a, b, strict=True))
        return all(_same(x, y, rtol) for x, y in zip(a, b, strict=True))
    if _float(b) and _number(a):
        return abs(float(a) - float(b)) <= rtol * max(abs(float(a)), abs(float(b)))
    return bool(a == b) and type(a) is type(b)


def _float(x: Any) -> bool:
    return isinstance(x, float | np.floating)


def _number(x: Any) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)


#: relative tolerance of :func:`agrees` for the benchmarks' answers (the workloads' products are
#: float64's, flstore_workloads/README.md; a swapped client, a sign or a 1 % error is 1e-2 or
#: more)
RTOL = 1e-5


def reference_from_store(cold: Any, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The reference's answer to the FLStore query ``body`` on the rounds ``cold`` holds (a
    :class:`cache_engine.cold_store.ColdStore`: the checkpoints in MinIO), or None where the
    reference has none (a workload :data:`KEYS` does not name, or Monte Carlo Shapley).

    The objects are read as the baselines read them (the query's plan from the rounds written,
    each object decoded to its flat float32 vector or its metadata); only the answer is
    computed here, by this module's own code. The evaluator (leave-one-out, exact Shapley) is
    the job's, from round 0's metadata, as every system builds it."""
    from cache_engine.catalog import MemoryCatalog
    from cache_engine.evaluators import build_evaluator
    from cache_engine.keys import ObjectKey
    from cache_engine.queries import fields_by_kind, parse_query, plan

    q = parse_query(body)
    if q.workload not in KEYS:
        return None
    catalog = MemoryCatalog()
    for r in cold.rounds(q.job):
        catalog.add_round(q.job, r, list(cold.round_meta(q.job, r)["clients"]))
    p = plan(q, catalog)
    if q.workload == "shapley" and p.params.get("method") != "exact":
        return None
    data = fields_by_kind({key: cold.get(key) for key in p.keys})
    evaluator = None
    if p.evaluator:
        m0 = cold.get(ObjectKey(q.job, 0, "meta"))
        evaluator = build_evaluator(m0.get("round_meta", {}).get("evaluator"))
    return reference_answer(
        q.workload, p.params, data["updates"], data["globals"], data["client_meta"], evaluator
    )


#: float64 bytes of the column block :func:`reference_from_store_streamed` holds at a time
STREAM_BLOCK_BYTES = 512 << 20
#: the workloads :func:`reference_from_store_streamed` answers from the deltas' inner products
INNER_PRODUCT_WORKLOADS = ("cosine-to-aggregate", "multi-krum", "foolsgold")


def reference_from_store_streamed(
    cold: Any,
    body: Mapping[str, Any],
    block_bytes: int = STREAM_BLOCK_BYTES,
    readers: int = 4,
    memo: dict[Any, NDArray[np.float64]] | None = None,
) -> dict[str, Any] | None:
    """:func:`reference_from_store` for rounds whose ``n x d`` float64 matrix does not fit in
    memory (200 ResNet-18-sized updates: 18 GB), or None where it has no answer.

    - Cosine-to-aggregate, Multi-Krum, FoolsGold: every answer of theirs is a function of the
      deltas' inner products. This reads the deltas ``w_{r,c} - g_{r-1}`` of the query a block of
      columns at a time (ranged reads of the stored objects), sums their float64 products
      ``D D^T`` over the blocks (numpy, float64 throughout: not the workloads' float32 blocks,
      memo or parts), and hands :func:`reference_answer` an ``m x m`` matrix whose rows have
      exactly those inner products (``V sqrt(L)`` of the eigendecomposition): cosines and
      distances, hence its answers, are those of the ``m x d`` deltas up to float64 round-off.
    - Leave-one-out, and GTG-Shapley's ``v_empty`` and ``v_full`` (its values are Monte Carlo):
      where the job's evaluator reads a model's head only (``span`` from 0), the models' head
      columns are read and :func:`reference_answer`'s coalition utilities run on them.
    - Anything else: None.

    ``memo``: a dict kept across calls on one store, where the deltas' products are kept by
    their objects (the three workloads on one round read the round once)."""
    from cache_engine.catalog import MemoryCatalog
    from cache_engine.evaluators import build_evaluator
    from cache_engine.keys import ObjectKey
    from cache_engine.queries import fields_by_kind, parse_query, plan

    q = parse_query(body)
    catalog = MemoryCatalog()
    for r in cold.rounds(q.job):
        catalog.add_round(q.job, r, list(cold.round_meta(q.job, r)["clients"]))
    p = plan(q, catalog)
    metas = fields_by_kind({k: cold.get(k) for k in p.keys if k.kind == "meta"})["client_meta"]
    ups = sorted((k for k in p.keys if k.kind == "update"), key=lambda k: (k.round, k.client))
    base = {k.round - 1: ObjectKey(q.job, k.round - 1, "global") for k in ups}
    if q.workload in INNER_PRODUCT_WORKLOADS:
        held = None if memo is None else memo.get(tuple(ups))
        gram = _streamed_gram(cold, ups, base, block_bytes, readers) if held is None else held
        if memo is not None:
            memo[tuple(ups)] = gram
        vals, vecs = np.linalg.eigh(gram)
        rows = vecs * np.sqrt(np.maximum(vals, 0.0))[None, :]
        updates: dict[int, dict[str, NDArray[np.floating]]] = {}
        for k, row in zip(ups, rows, strict=True):
            updates.setdefault(k.round, {})[k.client] = row
        zeros = {v: np.zeros(len(ups)) for v in base}
        return reference_answer(q.workload, p.params, updates, zeros, metas)
    if q.workload not in ("leave-one-out", "shapley") or not p.evaluator:
        return None
    m0 = cold.get(ObjectKey(q.job, 0, "meta"))
    evaluator = build_evaluator(m0.get("round_meta", {}).get("evaluator"))
    span = getattr(evaluator, "span", None)
    if span is None or span[0] != 0:
        return None  # an evaluator of whole models: n sub-models of d floats each
    heads = {k: cold.read_range(k, 0, span[1]) for k in [*ups, *base.values()]}
    data = fields_by_kind(heads)
    if q.workload == "leave-one-out":
        return reference_answer(
            q.workload, p.params, data["updates"], data["globals"], metas, evaluator
        )
    if p.params.get("method") == "exact":
        return reference_answer(q.workload, p.params, data["updates"], data["globals"], metas,
                                evaluator)  # fmt: skip
    r = int(p.params["round"])
    clients = _clients(data["updates"], r, p.params.get("clients"))
    x = deltas(data["updates"], data["globals"], r, clients)
    w = weights(metas, r, clients, p.params.get("weighting", "samples"))
    v = coalition_utility(evaluator, np.asarray(data["globals"][r - 1], np.float64), x, w)
    return {"v_empty": v(()), "v_full": v(tuple(range(len(clients))))}


def _streamed_gram(
    cold: Any, ups: Sequence[Any], base: Mapping[int, Any], block_bytes: int, readers: int
) -> NDArray[np.float64]:
    """``D D^T`` in float64 of the deltas ``w_{r,c} - g_{r-1}`` of ``ups``, summed over blocks
    of columns read by ranges (``readers`` ranged reads at once)."""
    from concurrent.futures import ThreadPoolExecutor

    keys = [*ups, *base.values()]
    with ThreadPoolExecutor(readers) as pool:
        index = dict(zip(keys, pool.map(cold.header, keys), strict=True))
        d = index[keys[0]].numel
        step = max(1024, block_bytes // (8 * len(keys)))
        out = np.zeros((len(ups), len(ups)))
        buf = np.empty((len(keys), step), np.float32)
        for a in range(0, d, step):
            b = min(d, a + step)

            def read(i: int, a: int = a, b: int = b) -> None:
                cold.read_range(keys[i], a, b, index[keys[i]], out=buf[i, : b - a])

            list(pool.map(read, range(len(keys))))
            rows = {k: i for i, k in enumerate(keys)}
            block = buf[: len(ups), : b - a].astype(np.float64)
            for i, k in enumerate(ups):
                block[i] -= buf[rows[base[k.round - 1]], : b - a]
            out += block @ block.T
    return (out + out.T) / 2.0
