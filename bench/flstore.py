"""FLStore benchmark: query latency vs ObjStore-Agg and Cache-Agg, policy hit rates, overhead.

``python -m bench.flstore [--quick] [--small] [--rounds N] [--clients N] [--memo both|on|off]
[--skip-latency] [--skip-handoff] [--skip-shapley] [--big-rounds N,N] [--budget-gb X]
[--big-queries W,W] [--out DIR]``

1. **Latency.** Rounds are written to a real MinIO (ResNet-18-sized updates: 11,181,642 float32,
   44.7 MB each; ``--small`` uses a small CNN). The same queries go, in one run, to FedFaaS
   (request tracker -> cache engine -> cache functions on the embedded runtime), ObjStore-Agg
   (an always-on server reading MinIO per query) and Cache-Agg (the same server reading Redis,
   through redis-py with the ``hiredis`` parser: the run fails if hiredis is not active).
   Queries follow each workload's natural order (per round, or sliding windows), so misses and
   prefetch behave as they would for an analyst; every latency is measured at the client.
   The plan runs once per inner-product memo mode, on a fresh stack and fresh baselines: **on**
   on all three (the cache functions' memo; the baselines keep the same memo keyed by object
   id, :class:`bench.baselines.server.ObjectGramMemo`) and **off** on all three. What the timed
   queries leave out is reported in rows of its own: the load and prefetch of each round into
   the cache functions, the background prefetch after queries, Cache-Agg's mirror into Redis;
   an 'all, load included' row charges it to the queries. After the live plan, the digits
   job's small queries are asked again in steady state (:func:`_steady`: each 20 times of each
   system in turn), where the query path, not the order of the plan, decides them.
2. **Zero-copy handoff** (:func:`handoff`): round notice -> every update of a round of 10
   ResNet-18 updates resident in a cache function, mapped from the node's store against read
   from MinIO.
3. **GTG-Shapley as the demo asks it** (:mod:`bench.flstore_shapley`): 20 clients, 200
   permutations, through the ``digits-evaluator`` function; batches of models against one
   model per request, same values.
4. **Rounds of 120 and 200 ResNet-18-sized updates** (:mod:`bench.flstore_rounds`, with
   ``--big-rounds``): the queries over coordinate parts across cache functions, or from MinIO
   past the node's memory budget, against ObjStore-Agg and Cache-Agg, answers compared with the
   in-process computation, the cache functions' memory against the budget.
5. **Policies.** Hit rates of all policies on the paper-shaped traces (bench.harness.flstore_trace).
6. **Overhead.** Location-table lookups (in memory and in Redis) and tracker records at 1,000 and
   100,000 entries: p99 latency and memory.

The process and every process it starts run with BLAS/OpenMP pools pinned to one thread
(:func:`bench.runinfo.pinned_threads`). Writes flstore.json, .md (rendered from the .json) and
.png to DIR (default bench/results) and prints the Markdown. ``--quick`` is a smoke run (small
CNN, 2 rounds, overhead at 1,000 entries).

The whole run takes over an hour. In parts (no part over 15 minutes on a shared 2-core machine):
``--big-rounds ''`` for sections 1-3, 5 and 6, then each size alone with ``--skip-latency
--skip-handoff --skip-shapley --skip-policies-and-overhead --big-rounds N`` (at 200 in two
runs: ``--big-systems fedfaas,objstore-agg``, then ``--big-systems cache-agg``), each to a
folder of its own, joined by :mod:`bench.flstore_merge` (each size, and each system of a size,
names the run it came from).
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.baselines.settings import BaselineSettings
from bench.flstore_rounds import SYSTEMS, WORKLOADS, big_rounds, same_answer
from bench.flstore_rounds_md import markdown as rounds_md
from bench.flstore_shapley import markdown as shapley_md
from bench.flstore_shapley import shapley
from bench.harness.flstore_stack import Child, FLStoreStack
from bench.harness.flstore_trace import hit_table, paper_traces
from bench.harness.round_window import resnet18_layout, status_bytes
from bench.harness.synthetic import SMALL_CNN, resnet18_like, write_digits_history, write_history
from bench.runinfo import PINNED_THREADS, pinned_threads, run_header, run_info, write_result
from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import update
from cache_engine.table import LocationTable, RedisLocationTable, redis_lookup
from core.services import MinioServer, RedisServer, free_port

log = logging.getLogger("bench.flstore")
RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ["flstore", "lru", "fifo", "lfu", "random", "static"]
JOB, DIGITS = "bench", "digits"
#: rounds of the digits job: each live digits row is asked once a round
DIGITS_ROUNDS = 8


def round_queries(job: str, r: int) -> list[tuple[str, dict[str, Any]]]:
    """The queries an analyst pipeline sends once round ``r`` is written (live, as in the
    paper: filtering, clustering, scheduling and tracking run for every new round; the
    cross-round workloads look at the last two rounds)."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("cosine-to-aggregate", {"rounds": [r], "params": {"bottom_k": 1}}),
        ("multi-krum", {"rounds": [r], "params": {"f": 1}}),
        ("kmeans", {"rounds": [r], "params": {"k": 2, "n_init": 1}}),
        ("personalize", {"rounds": [r], "params": {}}),
    ]
    if r >= 2:
        out += [
            ("foolsgold", {"params": {"first_round": r - 1, "last_round": r}}),
            ("provenance", {"params": {"first_round": r - 1, "last_round": r}}),
            ("oort", {"rounds": [r], "params": {"k": 3}}),
        ]
    out.append(("track", {"rounds": [r], "params": {"window": 10}}))
    return [(w, {"workload": w, "job": job, **b}) for w, b in out]


def evaluator_queries(job: str, r: int) -> list[tuple[str, dict[str, Any]]]:
    """Workloads that need the job's validation set (run on the real digits job)."""
    return [
        (wl, {"workload": wl, "job": job, "rounds": [r], "params": params})
        for wl, params in (
            ("leave-one-out", {}),
            ("shapley", {}),
            ("incentives", {"budget": 200}),
            ("evaluate", {}),
        )
    ]


def _fix_personalize(body: dict[str, Any], clients: dict[int, list[str]]) -> dict[str, Any]:
    if body["workload"] == "personalize":
        r = body["rounds"][0]
        body = {**body, "clients": [clients[r][0]]}
    return body


@dataclass
class _CacheRedis(RedisServer):
    """Cache-Agg's Redis: no append-only file (a cache, like ElastiCache; mirroring ResNet-sized
    rounds would otherwise write them all to disk again)."""

    def command(self) -> list[str]:
        return [*super().command(), "--appendonly", "no"]  # the last value of a directive wins


def latency(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Write the history once, then run the live query plan once per inner-product memo mode
    (``args.memo``), each on a fresh stack and fresh baselines."""
    shapes = SMALL_CNN if args.small else resnet18_like()
    d = sum(int(np.prod(s)) for s in shapes.values())
    ms = MinioServer(data_dir=work / "minio").start()
    cache_redis = _CacheRedis(data_dir=work / "cache-agg-redis")
    try:
        cache_redis.start()
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        t0 = time.perf_counter()
        h = write_history(
            cold,
            JOB,
            args.rounds,
            per_round=args.clients,
            pool=250,
            shapes=shapes,
            malicious=["c007"],
            seed=0,
            keep=False,
        )
        write_digits_history(
            cold, DIGITS, DIGITS_ROUNDS, per_round=args.clients, pool=50, flip=["c001"]
        )
        write_s = time.perf_counter() - t0
        log.info(
            "wrote %d rounds x %d clients of %d floats in %.1f s",
            args.rounds,
            args.clients,
            d,
            write_s,
        )
        model_bytes = d * 4
        modes = {
            memo: _latency_mode(args, work / f"memo-{memo}", ms, cache_redis, h.clients, memo)
            for memo in args.memo
        }
        return {
            "model": "ResNet-18-sized flat vectors" if not args.small else "small CNN",
            "floats_per_model": d,
            "model_mb": round(model_bytes / 1e6, 1),
            "rounds": args.rounds,
            "clients_per_round": args.clients,
            "pool": 250,
            "secondaries": 1,
            "write_s": write_s,
            "modes": modes,
        }
    finally:
        cache_redis.stop()
        ms.stop()


#: what each memo mode means, per system (the label of its rows)
MEMO_METHOD = {
    "on": "inner-product memo ON on all three: the cache functions' GramCache; ObjStore-Agg and "
    "Cache-Agg keep the same memo keyed by object id (they still fetch and decode every object "
    "per query)",
    "off": "inner-product memo OFF on all three: every query recomputes its inner products "
    "(cache functions started with FEDFAAS_FLSTORE_GRAM_MEMO=0, baselines with --no-gram-memo)",
}


def _latency_mode(
    args: argparse.Namespace,
    work: Path,
    ms: MinioServer,
    cache_redis: RedisServer,
    clients: dict[int, list[str]],
    memo: str,
) -> dict[str, Any]:
    """One pass of the live plan with the inner-product memo ``on`` or ``off`` on all three."""
    model_bytes = 4 * sum(
        int(np.prod(s)) for s in (SMALL_CNN if args.small else resnet18_like()).values()
    )
    rs = RedisServer(data_dir=work / "redis").start()  # a fresh engine and tracker state
    stack: FLStoreStack | None = None
    baselines: list[Child] = []
    try:
        cap = max(64 << 20, int(model_bytes * (3 * args.clients + 8)))
        # the cache functions' thread pools pinned as this process's, their memo on or off
        function_env = {**PINNED_THREADS, "FEDFAAS_FLSTORE_GRAM_MEMO": "1" if memo == "on" else "0"}
        stack = FLStoreStack(
            work / "stack",
            rs,
            ms,
            engine_settings={
                "secondaries": 1,
                "function_capacity_bytes": cap,
                "max_functions": 4,
                "capacity_objects": 4 * args.clients + 16,
                "function_env": function_env,
            },
            tracker_settings={"query_timeout": 300},
        ).start()
        urls = {}
        for name, backend, redis_server in (
            ("objstore-agg", "minio", rs),
            ("cache-agg", "redis", cache_redis),
        ):
            s = BaselineSettings(
                backend=backend,
                port=free_port(),
                minio_endpoint=ms.endpoint,
                minio_credentials_file=ms.credentials_file("cache-engine"),  # read-only
                redis_url=redis_server.url,
                redis_credentials_file=redis_server.credentials_file("baseline"),
                gram_memo=memo == "on",
            )
            log_path = work / "logs" / f"{name}.log"
            c = Child(name, s.to_argv(log_level="warning"), log_path, s.port, env=PINNED_THREADS)
            baselines.append(c)
            c.start()
            urls[name] = f"http://{s.host}:{s.port}"
        client = httpx.Client(timeout=600)
        health = {n: client.get(f"{u}/healthz").json() for n, u in urls.items()}
        parser = health["cache-agg"]["redis_parser"]
        if parser != "hiredis":
            raise RuntimeError(
                f"Cache-Agg reads Redis with redis-py's {parser} reply parser, not hiredis: "
                "install the bench extra (pip install -e '.[bench]', which brings hiredis)"
            )
        if any(hh["gram_memo"] is not (memo == "on") for hh in health.values()):
            raise RuntimeError(f"a baseline does not run with the memo {memo}: {health}")
        admin = cache_redis.client()
        admin.flushall()  # every mode mirrors the jobs afresh (its time is a row of its own)
        admin.close()
        t0 = time.perf_counter()
        mirrored = 0
        for jb in (JOB, DIGITS):
            r = client.post(f"{urls['cache-agg']}/admin/mirror/{jb}")
            r.raise_for_status()
            mirrored += int(r.json()["mirrored"])
        mirror_s = time.perf_counter() - t0
        stack.ingest(JOB, [0])
        stack.ingest(DIGITS, [0])
        # warm every server once (imports, connections), not timed
        warm = {"workload": "track", "job": DIGITS, "rounds": [0], "params": {"window": 1}}
        client.post(f"{stack.tracker_url}/v1/queries?wait=true", headers=stack.auth, json=warm)
        for u in urls.values():
            client.post(f"{u}/v1/queries", json=warm)
            # the baselines build the digits evaluator now, as the cache functions do when
            # round 0's metadata is loaded, so neither pays it on a timed query
            client.post(
                f"{u}/v1/queries", json={"workload": "evaluate", "job": DIGITS, "rounds": [1]}
            )
        stack.wait_idle(600)
        rows: list[dict[str, Any]] = []
        loads: list[dict[str, Any]] = []
        prefetch_s = 0.0
        plan = [(JOB, r, round_queries(JOB, r)) for r in range(1, args.rounds + 1)]
        plan += [(DIGITS, r, evaluator_queries(DIGITS, r)) for r in range(1, DIGITS_ROUNDS + 1)]
        for jb, rnd, qs in plan:  # live: each round is ingested, then its queries arrive
            t0 = time.perf_counter()
            stack.ingest(jb, [rnd])
            stack.wait_idle(600)
            loads.append({"job": jb, "round": rnd, "load_s": time.perf_counter() - t0})
            for wl, body in qs:
                body = _fix_personalize(body, clients)
                label = wl if jb == JOB else f"{wl} (digits)"
                # the systems take turns at going first; the background prefetch a query
                # starts is not charged to the next query, whichever system asks it, but it
                # is reported
                row = _one(client, stack, urls, label, body, first=len(rows))
                prefetch_s += row.pop("settle_s")
                rows.append({**row, "memo": memo})
                t0 = time.perf_counter()
                stack.wait_idle(600)
                prefetch_s += time.perf_counter() - t0
        steady = _steady(client, stack, urls)
        state = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        after = {n: client.get(f"{u}/healthz").json() for n, u in urls.items()}
        functions = _function_memos(stack, list(state["functions"]))
        if any(f.get("gram_memo") is not (memo == "on") for f in functions.values()):
            raise RuntimeError(f"a cache function does not run with the memo {memo}: {functions}")
        out = {
            "memo": memo,
            "method": MEMO_METHOD[memo],
            "redis_parser": parser,
            "baselines": after,
            "cache_functions": functions,
            "function_env": function_env,
            "cache_agg_mirror_s": mirror_s,
            "cache_agg_mirrored_objects": mirrored,
            "loads": loads,
            "load_s": sum(x["load_s"] for x in loads),
            "prefetch_after_queries_s": prefetch_s,
            "queries": rows,
            "summary": _summary(rows),
            "steady": steady,
            "engine": {"functions": state["functions"], "stats": state["stats"]},
        }
        out["with_load"] = with_load(out)
        return out
    finally:
        for c in baselines:
            c.stop()
        if stack is not None:
            stack.stop()
        rs.stop()


def _function_memos(stack: FLStoreStack, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each cache function's own word on its inner-product memo (``GET /ping``)."""
    from core.openfaas import OpenFaaS

    assert stack.runtime is not None
    out: dict[str, dict[str, Any]] = {}
    with OpenFaaS(stack.runtime_url, stack.runtime.auth) as gw:
        for name in names:
            r = gw.invoke(name, method="GET", path="/ping", headers=stack.function_auth)
            r.raise_for_status()
            st = r.json()
            out[name] = {"gram_memo": st.get("gram_memo"), "gram_pairs": st.get("gram_pairs")}
    return out


def _one(
    client: httpx.Client,
    stack: FLStoreStack,
    urls: dict[str, str],
    wl: str,
    body: dict[str, Any],
    *,
    first: int = 0,
    quiet: bool = False,
) -> dict[str, Any]:
    """Send one query to the three systems, system ``first`` (mod 3) of :data:`SYSTEMS`
    first, then on in turn, each asking on an idle engine (the background work a FedFaaS query
    starts is over before the next system asks: ``settle_s``, the time that took); latency
    measured at the client."""
    row: dict[str, Any] = {"workload": wl, "query": body, "order": []}
    address = {
        "fedfaas": f"{stack.tracker_url}/v1/queries?wait=true",
        "objstore-agg": f"{urls['objstore-agg']}/v1/queries",
        "cache-agg": f"{urls['cache-agg']}/v1/queries",
    }
    settle = 0.0
    for i in range(len(SYSTEMS)):
        system = SYSTEMS[(first + i) % len(SYSTEMS)]
        url = address[system]
        row["order"].append(system)
        if i:
            t = time.perf_counter()
            stack.wait_idle(600)
            settle += time.perf_counter() - t
        t = time.perf_counter()
        r = client.post(url, json=body, headers=stack.auth if system == "fedfaas" else None)
        dt = time.perf_counter() - t
        if r.status_code != 200:
            log.error("%s %s: HTTP %d %s", system, wl, r.status_code, r.text[:300])
            row[system] = {"latency_s": dt, "result": None, "error": f"HTTP {r.status_code}"}
            continue
        res = r.json()
        row[system] = {"latency_s": dt, "result": res["result"], "compute_s": res.get("compute_s")}
        if system == "fedfaas":
            row[system].update(
                hit=res.get("hit"),
                engine_s=res.get("engine_s"),
                loaded=res.get("loaded"),
                plan_kept=res.get("plan_kept"),
            )
        else:
            row[system].update(
                fetch_s=res["fetch_s"], decode_s=res["decode_s"], threads=res.get("threads")
            )
    row["same_result"] = (
        row["fedfaas"]["result"] is not None
        and same_answer(row["fedfaas"]["result"], row["objstore-agg"]["result"])
        and same_answer(row["fedfaas"]["result"], row["cache-agg"]["result"])
    )
    for s in SYSTEMS:
        row[s].pop("result")
    row["settle_s"] = settle
    if quiet:
        return row
    log.info(
        "%s %s: fedfaas %.3f s (hit %s, loaded %s), objstore %.3f s, cache %.3f s",
        wl,
        body.get("rounds") or body["params"],
        row["fedfaas"]["latency_s"],
        row["fedfaas"].get("hit"),
        row["fedfaas"].get("loaded"),
        row["objstore-agg"]["latency_s"],
        row["cache-agg"]["latency_s"],
    )
    return row


#: how often each small query is asked in the steady-state rows (the three systems in turn)
STEADY_REPEATS = 30


def _steady(
    client: httpx.Client, stack: FLStoreStack, urls: dict[str, str], repeats: int = STEADY_REPEATS
) -> dict[str, Any]:
    """The small queries of the digits job (its last round) in steady state: each asked
    ``repeats`` times of each system, the system that goes first rotating, after two
    unmeasured askings, on an idle engine. The live rows ask each once per round, right after
    the heavy queries of the ResNet job; at a few milliseconds a query, that order, not the
    query path, decides them (about 2 ms run to run on this 2-core machine). Beside the means,
    the paired difference FedFaaS - Cache-Agg (same asking) with its 95% confidence interval
    (Student's t): a difference whose interval spans zero is not one this run can tell."""
    from scipy import stats as st

    out: dict[str, Any] = {}
    last = DIGITS_ROUNDS
    small = [
        ("track", {"rounds": [last], "params": {"window": 10}}),
        ("oort", {"rounds": [last], "params": {"k": 3}}),
        *(
            (wl, {"rounds": [last], "params": p})
            for wl, p in (
                ("leave-one-out", {}),
                ("evaluate", {}),
                ("shapley", {}),
                ("incentives", {"budget": 200}),
            )
        ),
    ]
    for wl, b in small:
        body = {"workload": wl, "job": DIGITS, **b}
        lat: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        same, kept = True, 0
        for i in range(repeats + 2):
            stack.wait_idle(600)
            row = _one(client, stack, urls, f"{wl} (digits, steady)", body, first=i, quiet=True)
            same = same and row["same_result"]
            if i >= 2:
                kept += bool(row["fedfaas"].get("plan_kept"))
                for s in lat:
                    lat[s].append(row[s]["latency_s"])
        mean = {s: statistics.mean(x) for s, x in lat.items()}
        diff = [a - b for a, b in zip(lat["fedfaas"], lat["cache-agg"], strict=True)]
        half = float(st.t.ppf(0.975, len(diff) - 1)) * statistics.stdev(diff) / len(diff) ** 0.5
        out[wl] = {
            "queries": repeats,
            "mean_s": mean,
            "median_s": {s: statistics.median(x) for s, x in lat.items()},
            "reduction_vs_cache": 1 - mean["fedfaas"] / mean["cache-agg"],
            "diff_vs_cache_s": statistics.mean(diff),
            "diff_vs_cache_ci95_s": [statistics.mean(diff) - half, statistics.mean(diff) + half],
            "plans_kept": kept,
            "same_result": same,
        }
        log.info(
            "steady %s: fedfaas %.4f s, cache-agg %.4f s", wl, mean["fedfaas"], mean["cache-agg"]
        )
    return out


def _baseline_threads(rows: list[dict[str, Any]]) -> int | None:
    """The most BLAS/OpenMP threads the baselines' pools used on these queries (they say so in
    every answer); ``None`` when no answer said."""
    seen = [
        r[s]["threads"]
        for r in rows
        for s in ("objstore-agg", "cache-agg")
        if r[s].get("threads") is not None
    ]
    return max(seen) if seen else None


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for wl in dict.fromkeys(r["workload"] for r in rows):
        rr = [r for r in rows if r["workload"] == wl]
        m = {
            s: statistics.mean(r[s]["latency_s"] for r in rr)
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        out[wl] = {
            "queries": len(rr),
            "hits": sum(bool(r["fedfaas"].get("hit")) for r in rr),
            "objects_loaded": sum(int(r["fedfaas"].get("loaded") or 0) for r in rr),
            "mean_s": m,
            "median_s": {s: statistics.median(r[s]["latency_s"] for r in rr) for s in m},
            "reduction_vs_objstore": 1 - m["fedfaas"] / m["objstore-agg"],
            "reduction_vs_cache": 1 - m["fedfaas"] / m["cache-agg"],
            "same_result": all(r["same_result"] for r in rr),
            "errors": sum("error" in r[s] for r in rr for s in m),
            "baseline_threads": _baseline_threads(rr),
        }
    for label, sel in (
        ("all", [r for r in rows if "(digits)" not in r["workload"]]),
        ("all (digits)", [r for r in rows if "(digits)" in r["workload"]]),
    ):
        if not sel:
            continue
        allm = {
            s: statistics.mean(r[s]["latency_s"] for r in sel)
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        mem = [r for r in sel if r["fedfaas"].get("hit") and not r["fedfaas"].get("loaded")]
        memm = {
            s: statistics.mean(r[s]["latency_s"] for r in mem) if mem else 0.0
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        out[label + " (served from memory)"] = {
            "queries": len(mem),
            "hits": len(mem),
            "objects_loaded": 0,
            "mean_s": memm,
            "reduction_vs_objstore": 1 - memm["fedfaas"] / memm["objstore-agg"] if mem else 0,
            "reduction_vs_cache": 1 - memm["fedfaas"] / memm["cache-agg"] if mem else 0,
            "same_result": all(r["same_result"] for r in mem),
            "baseline_threads": _baseline_threads(mem),
        }
        out[label] = {
            "queries": len(sel),
            "hits": sum(bool(r["fedfaas"].get("hit")) for r in sel),
            "objects_loaded": sum(int(r["fedfaas"].get("loaded") or 0) for r in sel),
            "mean_s": allm,
            "reduction_vs_objstore": 1 - allm["fedfaas"] / allm["objstore-agg"],
            "reduction_vs_cache": 1 - allm["fedfaas"] / allm["cache-agg"],
            "same_result": all(r["same_result"] for r in sel),
            "baseline_threads": _baseline_threads(sel),
        }
    return out


def policies() -> list[dict[str, Any]]:
    traces = paper_traces()
    notes = {t.name: t.note for t in traces}
    return [{**r.as_dict(), "note": notes[r.trace]} for r in hit_table(POLICIES, traces, 64)]


def _p99(samples: list[float]) -> float:
    return float(np.percentile(np.array(samples), 99))


def overhead(work: Path, sizes: tuple[int, ...] = (1000, 100_000)) -> dict[str, Any]:

    out: dict[str, Any] = {}
    rs = RedisServer(data_dir=work / "redis-ovh").start()
    try:
        r = rs.client(decode_responses=True)
        for n in sizes:
            r.flushall()
            keys = [update("job", f"c{i % 250:03d}", i // 250 + 1) for i in range(n)]
            tracemalloc.start()
            t = LocationTable()
            for i, k in enumerate(keys):
                t.add(k, f"flstore-cache-{i % 4}")
                t.add(k, f"flstore-cache-{(i + 1) % 4}")
            mem = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            rng = np.random.default_rng(0)
            probe = [keys[i] for i in rng.integers(0, n, 20000)]
            lat = []
            for k in probe:
                t0 = time.perf_counter_ns()
                t.get(k)
                lat.append((time.perf_counter_ns() - t0) / 1000)
            # the same table in Redis (what the tracker and a restarted engine read)
            pipe = r.pipeline(transaction=False)
            for i, k in enumerate(keys):
                pipe.hset(
                    "flstore:loc:" + k.job,
                    k.field,
                    f"flstore-cache-{i % 4},flstore-cache-{(i + 1) % 4}",
                )
            pipe.execute()
            used = int(r.memory_usage("flstore:loc:job") or 0)
            rlat = []
            for k in probe[:5000]:
                t0 = time.perf_counter_ns()
                redis_lookup(r, [k])
                rlat.append((time.perf_counter_ns() - t0) / 1000)
            rt = RedisLocationTable(r)
            t0 = time.perf_counter()
            rt.load()
            load_s = time.perf_counter() - t0
            # tracker records: one hash per query
            before = int(r.info("memory")["used_memory"])
            pipe = r.pipeline(transaction=False)
            for i in range(n):
                pipe.hset(
                    f"flstore:query:{i:032x}",
                    mapping={
                        "status": "done",
                        "workload": "multi-krum",
                        "job": "job",
                        "tried": '[{"function": "flstore-cache-0", "outcome": "ok"}]',
                        "latency_s": "0.01",
                    },
                )
            pipe.execute()
            qmem = int(r.info("memory")["used_memory"]) - before
            qlat = []
            for i in rng.integers(0, n, 5000):
                t0 = time.perf_counter_ns()
                r.hgetall(f"flstore:query:{int(i):032x}")
                qlat.append((time.perf_counter_ns() - t0) / 1000)
            out[str(n)] = {
                "engine_table_lookup_p99_us": _p99(lat),
                "engine_table_lookup_p50_us": float(np.median(lat)),
                "engine_table_memory_mb": mem / 1e6,
                "redis_table_lookup_p99_us": _p99(rlat),
                "redis_table_lookup_p50_us": float(np.median(rlat)),
                "redis_table_memory_mb": used / 1e6,
                "engine_restart_load_s": load_s,
                "tracker_record_get_p99_us": _p99(qlat),
                "tracker_records_memory_mb": qmem / 1e6,
            }
        r.close()
    finally:
        rs.stop()
    return out


def handoff(work: Path, rounds: int = 3, clients: int = 10, small: bool = False) -> dict[str, Any]:
    """Round complete -> every update of the round resident in a cache function, through the
    zero-copy handoff from the node's store and through MinIO, on one stack, alternating.

    Two jobs hold the same-sized rounds in MinIO (written by :func:`write_history`); for the
    handoff job this process also plays the root gateway's store side with the gateway's own
    code (a :class:`~core.objstore.Namespace` and a
    :class:`~core.objstore.handoff.HandoffServer`: the round's updates sealed in the store
    and offered). The clock starts at the engine's round notice (``POST .../complete``, with
    the offer for the handoff job, as the gateway sends it) and stops when
    ``/v1/locations`` names a holder for every update (polled every 2 ms). One copy per object
    (no secondaries). The cache functions' private and shared memory come from
    ``/proc/<pid>/status`` after each mode's rounds.
    """
    from core import wire
    from core.objstore import Namespace
    from core.objstore.handoff import HandoffServer

    shapes = SMALL_CNN if small else {n: tuple(s) for n, s in resnet18_layout()}
    spec = wire.ModelSpec.build([(n, "F32", s) for n, s in shapes.items()])
    ms = MinioServer(data_dir=work / "minio-handoff").start()
    rs = RedisServer(data_dir=work / "redis-handoff").start()
    stack: FLStoreStack | None = None
    root = Path("/dev/shm") / f"fedfaas-bench-{secrets.token_hex(4)}"
    ns = Namespace(root, "node0", "handoff-shm", spec.object_nbytes, pool=clients)
    server = HandoffServer(root / "node0" / "handoff.sock")
    try:
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        h = write_history(cold, "handoff-shm", rounds, per_round=clients, shapes=shapes, seed=1)
        write_history(
            cold, "handoff-minio", rounds, per_round=clients, shapes=shapes, seed=2, keep=False
        )
        model_bytes = spec.numel * 4
        stack = FLStoreStack(
            work / "stack-handoff",
            rs,
            ms,
            engine_settings={
                "secondaries": 0,
                "max_functions": 2,
                "function_capacity_bytes": model_bytes * (2 * rounds * clients + 16),
                "capacity_objects": 4 * rounds * (clients + 2) + 16,
                "function_env": PINNED_THREADS,
            },
        ).start()
        client = httpx.Client(timeout=600)
        stack.ingest("handoff-shm", [0])
        stack.ingest("handoff-minio", [0])
        stack.wait_idle(600)
        rows: list[dict[str, Any]] = []
        for r in range(1, rounds + 1):
            lent: dict[str, bytes] = {}
            for c, x in h.updates[r].items():
                obj = ns.allocate()
                wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=1, count=1, round=r)
                wire.flat_view(obj.buf, spec)[: spec.numel] = x
                lent[c] = obj.key_bytes
                obj.close()
                ns.seal(lent[c])
                ns.retain(lent[c])  # the offer's lease (the store keeps its own)
            ticket = server.offer(ns, "handoff-shm", r, spec.numel, spec.hash.hex(), lent, 300)
            offer = {"socket": str(server.path), "ticket": ticket, "node": "node0"}
            for job, body in (("handoff-shm", {"handoff": offer}), ("handoff-minio", None)):
                t0 = time.perf_counter()
                resp = client.post(
                    f"{stack.engine_url}/v1/jobs/{job}/rounds/{r}/complete",
                    json=body,
                    headers=stack.auth,
                )
                resp.raise_for_status()
                ids = [update(job, c, r).id for c in resp.json()["clients"]]
                while True:
                    loc = client.get(
                        f"{stack.engine_url}/v1/locations", params={"ids": ids}, headers=stack.auth
                    ).json()
                    if all(loc.get(i) for i in ids):
                        break
                    time.sleep(0.002)
                dt = time.perf_counter() - t0
                stack.wait_idle(600)
                rows.append({"round": r, "path": "shm" if body else "minio", "seconds": dt})
                log.info("handoff round %d via %s: %.3f s", r, rows[-1]["path"], dt)
        state = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        memory = {}
        for fn in state["functions"]:
            ping = client.get(
                f"{stack.runtime_url}/function/{fn}/ping", headers=stack.function_auth
            ).json()
            pid = int(ping["pid"])
            memory[fn] = {
                "objects": ping["count"],
                "mapped_in_place": ping["objects_mapped"],
                "private_mb": (status_bytes(pid, "RssAnon")) / 1e6,
                "shared_mb": status_bytes(pid, "RssShmem") / 1e6,
            }
        return {
            "model": "small CNN"
            if small
            else f"ResNet-18, 10 classes: its {len(shapes)} floating-point tensors",
            "model_mb": round(model_bytes / 1e6, 1),
            "clients": clients,
            "rounds": rounds,
            "rows": rows,
            "handed_off": state["stats"]["objects_handed_off"],
            "functions": memory,
        }
    finally:
        if stack is not None:
            stack.stop()
        server.close()
        ns.close()
        rs.stop()
        ms.stop()


def with_load(mode: dict[str, Any]) -> dict[str, Any]:
    """Every query of a memo mode with what each system paid outside the timed queries, per
    query: FedFaaS's round loads + prefetch (at each round's end and after queries), Cache-Agg's
    mirror of the jobs into Redis; ObjStore-Agg pays nothing outside its queries."""
    rows = mode["queries"]
    n = len(rows)
    extra = {
        "fedfaas": mode["load_s"] + mode["prefetch_after_queries_s"],
        "objstore-agg": 0.0,
        "cache-agg": mode["cache_agg_mirror_s"],
    }
    m = {s: (sum(r[s]["latency_s"] for r in rows) + extra[s]) / n for s in SYSTEMS}
    return {
        "queries": n,
        "outside_queries_s": extra,
        "mean_s": m,
        "reduction_vs_objstore": 1 - m["fedfaas"] / m["objstore-agg"],
        "reduction_vs_cache": 1 - m["fedfaas"] / m["cache-agg"],
        "same_result": all(r["same_result"] for r in rows),
    }


def _pct(x: float) -> str:
    return f"{-100 * x:+.1f}%"


def markdown(res: dict[str, Any]) -> str:
    """The Markdown report, rendered from the result JSON (``write_result`` reads it back)."""
    lines = ["# FLStore benchmark", "", run_header(res["run"]), ""]
    if "latency" in res:
        lt = res["latency"]
        lines += [
            f"Model: {lt['model']} ({lt['floats_per_model']:,} float32, "
            f"{lt['model_mb']} MB per update); {lt['rounds']} rounds x "
            f"{lt['clients_per_round']} of {lt['pool']} clients in MinIO; 1 primary + "
            f"{lt['secondaries']} secondary per object. Mean latency per query, measured "
            "at the client. Rows marked (digits) run on a second, real job (softmax "
            f"regression on load_digits, 650 floats, {DIGITS_ROUNDS} rounds) because they "
            "need a validation-set evaluator. Live order: each round is ingested (hot data "
            "to the cache functions; MinIO already has it), then that round's queries "
            "arrive, each asked of the three systems in turn, the one that goes first "
            "rotating from query to query, each on an idle engine. Rows '(served from memory)' keep the queries that needed no load "
            "on the query path. The load and prefetch rows give what the timed queries leave "
            "out; 'all, load included' charges it to the queries.",
            "",
        ]
        for memo, mode in lt["modes"].items():
            tag = f"memo {memo}"
            lines += [
                f"### Inner-product memo {memo.upper()}",
                "",
                f"Method ({tag}): {mode['method']}. Cache-Agg's Redis reply parser: "
                f"{mode['redis_parser']}. The memo as each process reports it after the run: "
                + ", ".join(
                    f"{n} {'on' if x['gram_memo'] else 'off'} ({x['gram_pairs']} pairs)"
                    for n, x in {**mode["cache_functions"], **mode["baselines"]}.items()
                )
                + ". baseline threads: the most threads a BLAS/OpenMP pool of the baseline "
                "servers used on the row's queries (each answer says); the cache functions run "
                "with "
                + ", ".join(
                    f"{k}={v}" for k, v in mode["function_env"].items() if k.endswith("THREADS")
                )
                + ".",
                "",
                "| method | workload | queries | FedFaaS hits | loads on query path | FedFaaS s | "
                "ObjStore-Agg s | Cache-Agg s | vs ObjStore | vs Cache | same answer | "
                "baseline threads |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for wl, s in mode["summary"].items():
                mm = s["mean_s"]
                lines.append(
                    f"| {tag} | {wl} | {s['queries']} | {s['hits']} | "
                    f"{s.get('objects_loaded', '')} | {mm['fedfaas']:.3f} | "
                    f"{mm['objstore-agg']:.3f} | {mm['cache-agg']:.3f} | "
                    f"{_pct(s['reduction_vs_objstore'])} | {_pct(s['reduction_vs_cache'])} | "
                    f"{s['same_result']} | {s.get('baseline_threads', '')} |"
                )
            loads = mode["loads"]
            lines += [
                f"| {tag} | round load + prefetch into the cache functions (not in the query "
                f"rows; FedFaaS only, mean per round) | {len(loads)} rounds | | | "
                f"{mode['load_s'] / max(1, len(loads)):.3f} | - | - | | | | |",
                f"| {tag} | background prefetch after queries (not in the query rows; FedFaaS "
                f"only, total) | | | | {mode['prefetch_after_queries_s']:.3f} | - | - | | | | |",
                f"| {tag} | mirror of the jobs into Redis (not in the query rows; Cache-Agg only, "
                f"total, {mode['cache_agg_mirrored_objects']} objects) | | | | - | - | "
                f"{mode['cache_agg_mirror_s']:.3f} | | | | |",
            ]
            w = mode["with_load"]
            mm = w["mean_s"]
            lines.append(
                f"| {tag} | **all, load included** (every query + the rows above, per query) | "
                f"{w['queries']} | | | {mm['fedfaas']:.3f} | {mm['objstore-agg']:.3f} | "
                f"{mm['cache-agg']:.3f} | {_pct(w['reduction_vs_objstore'])} | "
                f"{_pct(w['reduction_vs_cache'])} | {w['same_result']} | |"
            )
            lines.append("")
            if mode.get("steady"):
                lines += _steady_md(tag, mode["steady"])
        lines += [
            "Targets: >= 90% lower mean latency than ObjStore-Agg, >= 80% lower than Cache-Agg.",
            "",
        ]
    if "handoff" in res:
        lines += _handoff_md(res["handoff"])
    if "shapley" in res:
        lines += shapley_md(res["shapley"])
    if "big_rounds" in res:
        lines += rounds_md(res["big_rounds"])
    if "policies" in res:
        lines += _policies_md(res["policies"])
    if "overhead" in res:
        lines += _overhead_md(res["overhead"])
    return "\n".join(lines) + "\n"


def _policies_md(policies: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Policy hit rates (capacity 64 objects)",
        "",
        "| trace | " + " | ".join(POLICIES) + " |",
        "|---|" + "---|" * len(POLICIES),
    ]
    by = {(p["trace"], p["policy"]): p for p in policies}
    for t in dict.fromkeys(p["trace"] for p in policies):
        cells = [f"{100 * by[(t, p)]['hit_rate']:.2f}%" for p in POLICIES]
        lines.append(f"| {t} ({by[(t, 'flstore')]['requests']} req) | " + " | ".join(cells) + " |")
    return lines + [
        "",
        "Request-level hit rate (a request hits when all its objects are resident). "
        "Traces: "
        + "; ".join(
            f"{t}: {by[(t, 'flstore')]['note']}"
            for t in dict.fromkeys(p["trace"] for p in policies)
        ),
        "",
    ]


def _overhead_md(overhead: dict[str, Any]) -> list[str]:
    lines = [
        "## Lookup overhead",
        "",
        "| entries | engine lookup p99 us | engine table MB | Redis lookup p99 us | "
        "Redis table MB | tracker record GET p99 us | tracker records MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, o in overhead.items():
        lines.append(
            f"| {int(n):,} | {o['engine_table_lookup_p99_us']:.2f} | "
            f"{o['engine_table_memory_mb']:.2f} | {o['redis_table_lookup_p99_us']:.1f} | "
            f"{o['redis_table_memory_mb']:.2f} | {o['tracker_record_get_p99_us']:.1f} | "
            f"{o['tracker_records_memory_mb']:.2f} |"
        )
    return lines + ["", "Target: lookup <= 100 us p99."]


def _steady_md(tag: str, steady: dict[str, Any]) -> list[str]:
    n = next(iter(steady.values()))["queries"]
    lines = [
        f"Small queries of the digits job in steady state ({tag}): each asked {n} times of "
        "each system, the system that goes first rotating (after two unmeasured askings), on "
        "an idle engine; the live rows above ask each once a round, right after the ResNet "
        "job's heavy queries. 'FedFaaS - Cache-Agg': the mean of the paired differences, "
        "with its 95% confidence interval (Student's t); an interval that spans 0 is a "
        "difference this run cannot tell from noise. 'kept': FedFaaS askings the request "
        "tracker answered on the plan it kept from an earlier asking (no call to the cache "
        "engine; for track and oort, whose answer the engine gives from the rounds' metadata, "
        "the kept answer itself).",
        "",
        "| workload | queries | FedFaaS mean ms | median ms | kept | ObjStore-Agg mean ms | "
        "Cache-Agg mean ms | median ms | vs Cache | FedFaaS - Cache-Agg ms (95% CI) | "
        "same answer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, x in steady.items():
        m, md = x["mean_s"], x["median_s"]
        lo, hi = x["diff_vs_cache_ci95_s"]
        lines.append(
            f"| {wl} | {x['queries']} | {1e3 * m['fedfaas']:.2f} | {1e3 * md['fedfaas']:.2f} | "
            f"{x['plans_kept']} | {1e3 * m['objstore-agg']:.2f} | "
            f"{1e3 * m['cache-agg']:.2f} | "
            f"{1e3 * md['cache-agg']:.2f} | {_pct(x['reduction_vs_cache'])} | "
            f"{1e3 * x['diff_vs_cache_s']:+.2f} ({1e3 * lo:+.2f} to {1e3 * hi:+.2f}) | "
            f"{x['same_result']} |"
        )
    return [*lines, ""]


def _handoff_md(hd: dict[str, Any]) -> list[str]:
    by = {p: [x["seconds"] for x in hd["rows"] if x["path"] == p] for p in ("shm", "minio")}
    shm, mio = statistics.mean(by["shm"]), statistics.mean(by["minio"])
    lines = [
        "## Zero-copy handoff: round complete -> all updates resident in the cache",
        "",
        f"{hd['clients']} updates per round ({hd['model']}, {hd['model_mb']} MB each), "
        f"{hd['rounds']} rounds per path, alternating on one stack (one copy per "
        "object). The clock starts at the engine's round notice and stops when the engine's "
        "location table names a holder for every update of the round. shm: the cache "
        "function claims the round from the node's store (the gateway's handoff code, "
        "played by the benchmark process) and maps each update in place; MinIO: it reads "
        "and decodes each update from MinIO.",
        "",
        "| path | rounds | mean s | min s | max s | vs MinIO |",
        "|---|---|---|---|---|---|",
    ]
    for p, xs in by.items():
        lines.append(
            f"| {'shm (mapped in place)' if p == 'shm' else 'MinIO (read + decode)'} | "
            f"{len(xs)} | {statistics.mean(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | "
            f"{statistics.mean(xs) / mio:.3f}x |"
        )
    lines += [
        "",
        f"Speed-up of the handoff: {mio / shm:.1f}x. Objects mapped in place (engine count): "
        f"{hd['handed_off']}.",
        "",
        "| cache function | objects | mapped in place | private MB (RssAnon) | "
        "shared MB (RssShmem) |",
        "|---|---|---|---|---|",
    ]
    for fn, m in hd["functions"].items():
        lines.append(
            f"| {fn} | {m['objects']} | {m['mapped_in_place']} | {m['private_mb']:.0f} | "
            f"{m['shared_mb']:.0f} |"
        )
    lines += [
        "",
        "Private memory holds the objects read from MinIO (both jobs' initial models and "
        "metadata included); the mapped updates are the store's own pages, counted in "
        "RssShmem only once a query touches them, and never copied.",
    ]
    return [*lines, ""]


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    if "latency" in res:
        modes = res["latency"]["modes"]
        first = modes.get("on") or next(iter(modes.values()))
        axes[0].set_title(f"inner-product memo {first['memo']} on all three")
        summ = {k: v for k, v in first["summary"].items() if not k.startswith("all")}
        names = list(summ)
        x = np.arange(len(names))
        for i, s in enumerate(("fedfaas", "objstore-agg", "cache-agg")):
            axes[0].bar(x + (i - 1) * 0.27, [summ[n]["mean_s"][s] for n in names], 0.27, label=s)
        axes[0].set_xticks(x, names, rotation=35, ha="right")
        axes[0].set_yscale("log")
        axes[0].set_ylabel("mean latency per query (s)")
        axes[0].legend()
    by = {(p["trace"], p["policy"]): p["hit_rate"] for p in res.get("policies", [])}
    traces = list(dict.fromkeys(p["trace"] for p in res.get("policies", [])))
    x = np.arange(len(traces))
    for i, p in enumerate(POLICIES):
        axes[1].bar(x + (i - 2.5) * 0.13, [100 * by[(t, p)] for t in traces], 0.13, label=p)
    axes[1].set_xticks(x, traces, rotation=20)
    axes[1].set_ylabel("hit rate (%)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.flstore", description=__doc__)
    ap.add_argument("--small", action="store_true", help="small CNN instead of ResNet-18 sizes")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument(
        "--memo",
        choices=("both", "on", "off"),
        default="both",
        help="inner-product memo on all three systems: on (like with like), off, or both "
        "(default; one pass each)",
    )
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-handoff", action="store_true")
    ap.add_argument("--skip-shapley", action="store_true")
    ap.add_argument(
        "--skip-policies-and-overhead",
        action="store_true",
        help="no policy hit rates, no lookup overhead (a part of the benchmark that "
        "bench.flstore_merge adds to a result that has them)",
    )
    ap.add_argument(
        "--big-rounds",
        default="120,200",
        help="sizes of the ResNet-18-sized rounds to run (default 120,200: they write 15 GB "
        "to MinIO and take the machine for about an hour; '' for none)",
    )
    ap.add_argument(
        "--budget-gb",
        type=float,
        default=8.0,
        help="the node's memory budget for the big rounds, in GB (below a 200-update round, "
        "8.9 GB; above a 120-update one, 5.4 GB, with the functions' own memory)",
    )
    ap.add_argument(
        "--big-repeats",
        type=int,
        default=3,
        help="askings of each query of each system at each big-round size (default 3)",
    )
    ap.add_argument(
        "--big-gtg-permutations",
        type=int,
        default=5,
        help="GTG-Shapley's max_permutations at the big-round sizes (default 5)",
    )
    ap.add_argument(
        "--big-systems",
        default=",".join(SYSTEMS),
        help="the systems asked at the big-round sizes (default all: "
        + ",".join(SYSTEMS)
        + "; at 200 updates the three take longer than 15 minutes: run them in parts, joined "
        "by bench.flstore_merge)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: --small, 2 rounds, lookup overhead at 1,000 entries only, no big rounds",
    )
    ap.add_argument(
        "--big-queries",
        default=",".join(WORKLOADS),
        help="the big rounds' queries to ask, by workload (default all: "
        + ",".join(WORKLOADS)
        + ")",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the result files")
    args = ap.parse_args(argv)
    only = [x for x in args.big_queries.split(",") if x]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        ap.error(f"--big-queries: unknown {unknown}; known: {', '.join(WORKLOADS)}")
    systems = [x for x in args.big_systems.split(",") if x]
    if not systems or set(systems) - set(SYSTEMS):
        ap.error(f"--big-systems: some of {', '.join(SYSTEMS)}, not {args.big_systems!r}")
    if args.quick:
        args.small, args.rounds, args.big_rounds = True, 2, ""
    args.memo = ["on", "off"] if args.memo == "both" else [args.memo]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with pinned_threads(1):  # this process and every process it starts
        res: dict[str, Any] = {
            "run": run_info("bench.flstore", sys.argv[1:] if argv is None else argv)
        }
        with tempfile.TemporaryDirectory(prefix="bench-flstore-") as tmp:
            work = Path(tmp)
            if not args.skip_policies_and_overhead:
                res["policies"] = policies()
                res["overhead"] = overhead(work, (1000,) if args.quick else (1000, 100_000))
            if not args.skip_latency:
                res["latency"] = latency(args, work)
            if not args.skip_handoff:
                res["handoff"] = handoff(work, small=args.small)
            if not args.skip_shapley:
                res["shapley"] = shapley(work)
            if args.big_rounds:
                sizes = [int(x) for x in args.big_rounds.split(",") if x]
                budget = int(args.budget_gb * 1e9)
                res["big_rounds"] = big_rounds(
                    work,
                    sizes,
                    budget,
                    args.big_repeats,
                    args.big_gtg_permutations,
                    only,
                    systems,
                )
    stored, md = write_result(res, "flstore", markdown, args.out)
    plot(stored, args.out / "flstore.png")
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
