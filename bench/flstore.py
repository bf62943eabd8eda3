"""FLStore benchmark: query latency vs ObjStore-Agg and Cache-Agg, policy hit rates, overhead.

``python -m bench.flstore [--small] [--rounds N] [--clients N]``

1. **Latency.** Rounds are written to a real MinIO (ResNet-18-sized updates: 11,181,642 float32,
   44.7 MB each; ``--small`` uses a small CNN). The same queries go, in one run, to FedFaaS
   (request tracker -> cache engine -> cache functions on the embedded runtime), ObjStore-Agg
   (an always-on server reading MinIO per query) and Cache-Agg (the same server reading Redis).
   Queries follow each workload's natural order (per round, or sliding windows), so misses and
   prefetch behave as they would for an analyst; every latency is measured at the client.
2. **Policies.** Hit rates of all policies on the paper-shaped traces (bench.harness.flstore_trace).
3. **Overhead.** Location-table lookups (in memory and in Redis) and tracker records at 1,000 and
   100,000 entries: p99 latency and memory.

Writes bench/results/flstore.json, .md and .png and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
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
from bench.harness.flstore_stack import Child, FLStoreStack
from bench.harness.flstore_trace import hit_table, paper_traces
from bench.harness.synthetic import SMALL_CNN, resnet18_like, write_digits_history, write_history
from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import update
from cache_engine.table import LocationTable, RedisLocationTable, redis_lookup
from fedfaas.services import MinioServer, RedisServer, free_port

log = logging.getLogger("bench.flstore")
RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ["flstore", "lru", "fifo", "lfu", "random", "static"]


def machine() -> dict[str, Any]:
    import psutil

    return {
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


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
    shapes = SMALL_CNN if args.small else resnet18_like()
    d = sum(int(np.prod(s)) for s in shapes.values())
    rs = RedisServer(data_dir=work / "redis").start()
    ms = MinioServer(data_dir=work / "minio").start()
    cache_redis = _CacheRedis(data_dir=work / "cache-agg-redis")
    stack: FLStoreStack | None = None
    baselines: list[Child] = []
    try:
        cache_redis.start()
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        job = "bench"
        t0 = time.perf_counter()
        h = write_history(
            cold,
            job,
            args.rounds,
            per_round=args.clients,
            pool=250,
            shapes=shapes,
            malicious=["c007"],
            seed=0,
            keep=False,
        )
        digits = "digits"
        write_digits_history(cold, digits, 3, per_round=args.clients, pool=50, flip=["c001"])
        write_s = time.perf_counter() - t0
        log.info(
            "wrote %d rounds x %d clients of %d floats in %.1f s",
            args.rounds,
            args.clients,
            d,
            write_s,
        )
        model_bytes = d * 4
        cap = max(64 << 20, int(model_bytes * (3 * args.clients + 8)))
        stack = FLStoreStack(
            work / "stack",
            rs,
            ms,
            engine_settings={
                "secondaries": 1,
                "function_capacity_bytes": cap,
                "max_functions": 4,
                "capacity_objects": 4 * args.clients + 16,
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
            )
            log_path = work / "logs" / f"{name}.log"
            c = Child(name, s.to_argv(log_level="warning"), log_path, s.port)
            baselines.append(c)
            c.start()
            urls[name] = f"http://{s.host}:{s.port}"
        client = httpx.Client(timeout=600)
        client.post(f"{urls['cache-agg']}/admin/mirror/{job}").raise_for_status()
        client.post(f"{urls['cache-agg']}/admin/mirror/{digits}").raise_for_status()
        stack.ingest(job, [0])
        stack.ingest(digits, [0])
        # warm every server once (imports, connections), not timed
        warm = {"workload": "track", "job": digits, "rounds": [0], "params": {"window": 1}}
        client.post(f"{stack.tracker_url}/v1/queries?wait=true", headers=stack.auth, json=warm)
        for u in urls.values():
            client.post(f"{u}/v1/queries", json=warm)
            # the baselines build the digits evaluator now, as the cache functions do when
            # round 0's metadata is loaded, so neither pays it on a timed query
            client.post(
                f"{u}/v1/queries", json={"workload": "evaluate", "job": digits, "rounds": [1]}
            )
        stack.wait_idle(600)
        rows: list[dict[str, Any]] = []
        ingest_s = 0.0
        plan = [(job, r, round_queries(job, r)) for r in range(1, args.rounds + 1)]
        plan += [(digits, r, evaluator_queries(digits, r)) for r in range(1, 4)]
        for jb, rnd, qs in plan:  # live: each round is ingested, then its queries arrive
            t0 = time.perf_counter()
            stack.ingest(jb, [rnd])
            stack.wait_idle(600)
            ingest_s += time.perf_counter() - t0
            for wl, body in qs:
                body = _fix_personalize(body, h.clients)
                rows.append(_one(client, stack, urls, wl if jb == job else f"{wl} (digits)", body))
                stack.wait_idle(600)  # background prefetch is not charged to the next query
        state = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        return {
            "model": "ResNet-18-sized flat vectors" if not args.small else "small CNN",
            "floats_per_model": d,
            "model_mb": round(model_bytes / 1e6, 1),
            "rounds": args.rounds,
            "clients_per_round": args.clients,
            "pool": 250,
            "secondaries": 1,
            "write_s": write_s,
            "ingest_s": ingest_s,
            "queries": rows,
            "summary": _summary(rows),
            "engine": {"functions": state["functions"], "stats": state["stats"]},
        }
    finally:
        for c in baselines:
            c.stop()
        if stack is not None:
            stack.stop()
        cache_redis.stop()
        rs.stop()
        ms.stop()


def _one(
    client: httpx.Client, stack: FLStoreStack, urls: dict[str, str], wl: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Send one query to the three systems; latency measured at the client."""
    row: dict[str, Any] = {"workload": wl, "query": body}
    for system, url in (
        ("fedfaas", f"{stack.tracker_url}/v1/queries?wait=true"),
        ("objstore-agg", f"{urls['objstore-agg']}/v1/queries"),
        ("cache-agg", f"{urls['cache-agg']}/v1/queries"),
    ):
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
                hit=res.get("hit"), engine_s=res.get("engine_s"), loaded=res.get("loaded")
            )
        else:
            row[system].update(fetch_s=res["fetch_s"], decode_s=res["decode_s"])
    row["same_result"] = (
        row["fedfaas"]["result"] is not None
        and _same(row["fedfaas"]["result"], row["objstore-agg"]["result"])
        and _same(row["fedfaas"]["result"], row["cache-agg"]["result"])
    )
    for s in ("fedfaas", "objstore-agg", "cache-agg"):
        row[s].pop("result")
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


def _same(a: Any, b: Any, tol: float = 1e-4) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return abs(a - b) <= tol * max(1.0, abs(a), abs(b))
    return bool(a == b)


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
        }
        out[label] = {
            "queries": len(sel),
            "hits": sum(bool(r["fedfaas"].get("hit")) for r in sel),
            "objects_loaded": sum(int(r["fedfaas"].get("loaded") or 0) for r in sel),
            "mean_s": allm,
            "reduction_vs_objstore": 1 - allm["fedfaas"] / allm["objstore-agg"],
            "reduction_vs_cache": 1 - allm["fedfaas"] / allm["cache-agg"],
            "same_result": all(r["same_result"] for r in sel),
        }
    return out


def policies() -> list[dict[str, Any]]:
    traces = paper_traces()
    notes = {t.name: t.note for t in traces}
    return [{**r.as_dict(), "note": notes[r.trace]} for r in hit_table(POLICIES, traces, 64)]


def _p99(samples: list[float]) -> float:
    return float(np.percentile(np.array(samples), 99))


def overhead(work: Path) -> dict[str, Any]:

    out: dict[str, Any] = {}
    rs = RedisServer(data_dir=work / "redis-ovh").start()
    try:
        r = rs.client(decode_responses=True)
        for n in (1000, 100_000):
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


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# FLStore benchmark ({m['cores']} cores, {m['memory_gib']} GiB)", ""]
    if "latency" in res:
        lt = res["latency"]
        lines += [
            f"Model: {lt['model']} ({lt['floats_per_model']:,} float32, "
            f"{lt['model_mb']} MB per update); {lt['rounds']} rounds x "
            f"{lt['clients_per_round']} of {lt['pool']} clients in MinIO; 1 primary + "
            f"{lt['secondaries']} secondary per object. Mean latency per query, measured "
            "at the client. Rows marked (digits) run on a second, real job (softmax "
            "regression on load_digits, 650 floats, 3 rounds) because they need a "
            "validation-set evaluator. Live order: each round is ingested (hot data to "
            "the cache functions; MinIO already has it), then that round's queries "
            "arrive. Rows '(served from memory)' keep the queries that needed no load "
            "on the query path.",
            "",
            "| workload | queries | FedFaaS hits | loads on query path | FedFaaS s | "
            "ObjStore-Agg s | Cache-Agg s | vs ObjStore | vs Cache | same answer |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for wl, s in lt["summary"].items():
            mm = s["mean_s"]
            lines.append(
                f"| {wl} | {s['queries']} | {s['hits']} | {s.get('objects_loaded', '')} | "
                f"{mm['fedfaas']:.3f} | "
                f"{mm['objstore-agg']:.3f} | {mm['cache-agg']:.3f} | "
                f"{-100 * s['reduction_vs_objstore']:+.1f}% | "
                f"{-100 * s['reduction_vs_cache']:+.1f}% | {s['same_result']} |"
            )
        lines += [
            "",
            "Targets: >= 90% lower mean latency than ObjStore-Agg, >= 80% lower than Cache-Agg.",
            "",
        ]
    lines += [
        "## Policy hit rates (capacity 64 objects)",
        "",
        "| trace | " + " | ".join(POLICIES) + " |",
        "|---|" + "---|" * len(POLICIES),
    ]
    by = {(p["trace"], p["policy"]): p for p in res["policies"]}
    for t in dict.fromkeys(p["trace"] for p in res["policies"]):
        cells = [f"{100 * by[(t, p)]['hit_rate']:.2f}%" for p in POLICIES]
        lines.append(f"| {t} ({by[(t, 'flstore')]['requests']} req) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Request-level hit rate (a request hits when all its objects are resident). "
        "Traces: "
        + "; ".join(
            f"{t}: {by[(t, 'flstore')]['note']}"
            for t in dict.fromkeys(p["trace"] for p in res["policies"])
        ),
        "",
        "## Lookup overhead",
        "",
        "| entries | engine lookup p99 us | engine table MB | Redis lookup p99 us | "
        "Redis table MB | tracker record GET p99 us | tracker records MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, o in res["overhead"].items():
        lines.append(
            f"| {int(n):,} | {o['engine_table_lookup_p99_us']:.2f} | "
            f"{o['engine_table_memory_mb']:.2f} | {o['redis_table_lookup_p99_us']:.1f} | "
            f"{o['redis_table_memory_mb']:.2f} | {o['tracker_record_get_p99_us']:.1f} | "
            f"{o['tracker_records_memory_mb']:.2f} |"
        )
    lines += ["", "Target: lookup <= 100 us p99."]
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    if "latency" in res:
        summ = {k: v for k, v in res["latency"]["summary"].items() if not k.startswith("all")}
        names = list(summ)
        x = np.arange(len(names))
        for i, s in enumerate(("fedfaas", "objstore-agg", "cache-agg")):
            axes[0].bar(x + (i - 1) * 0.27, [summ[n]["mean_s"][s] for n in names], 0.27, label=s)
        axes[0].set_xticks(x, names, rotation=35, ha="right")
        axes[0].set_yscale("log")
        axes[0].set_ylabel("mean latency per query (s)")
        axes[0].legend()
    by = {(p["trace"], p["policy"]): p["hit_rate"] for p in res["policies"]}
    traces = list(dict.fromkeys(p["trace"] for p in res["policies"]))
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
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="bench-flstore-") as tmp:
        work = Path(tmp)
        res["policies"] = policies()
        res["overhead"] = overhead(work)
        if not args.skip_latency:
            res["latency"] = latency(args, work)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "flstore.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (RESULTS / "flstore.md").write_text(md)
    plot(res, RESULTS / "flstore.png")
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
