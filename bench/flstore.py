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
   in-process computation, the cache functions' memory and the platform's cgroup against the
   budget. A result of its own: ``flstore_rounds.json``, ``.md`` and ``.png``.
5. **Policies.** Hit rates of all policies on the paper-shaped traces (bench.harness.flstore_trace).
6. **Overhead.** Location-table lookups (in memory and in Redis) and tracker records at 1,000 and
   100,000 entries: p99 latency and memory.

The process and every process it starts run with BLAS/OpenMP pools pinned to one thread
(:func:`bench.runinfo.pinned_threads`). Writes flstore.json, .md (rendered from the .json) and
.png to DIR (default bench/results), and the big rounds to flstore_rounds.json, .md and .png
(no flstore.* when only the big rounds run), and prints the Markdown. ``--quick`` is a smoke run (small
CNN, 2 rounds, overhead at 1,000 entries).

The whole run takes over an hour. In parts (no part over 15 minutes on a shared 2-core machine):
``--big-rounds ''`` for sections 1-3, 5 and 6, then each size alone with ``--skip-latency
--skip-handoff --skip-shapley --skip-policies-and-overhead --big-rounds N`` (the three systems
of a size in one run: at 200 updates and 2 askings about 20 minutes; ``--big-systems`` asks
some of them), each to a folder of its own, joined by :mod:`bench.flstore_merge` (``--result
flstore_rounds`` for the big rounds; each size, and each system of a size, names the run it
came from).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.baselines.settings import BaselineSettings
from bench.flstore_micro import handoff, overhead, policies
from bench.flstore_plan import DIGITS, DIGITS_ROUNDS, JOB, evaluator_queries, round_queries
from bench.flstore_reference import RTOL as REFERENCE_RTOL
from bench.flstore_reference import agrees, reference_from_store
from bench.flstore_report import markdown, plot, summary, with_load
from bench.flstore_rounds import SYSTEMS, WORKLOADS, CacheRedis, big_rounds, same_answer
from bench.flstore_rounds_report import document as rounds_document
from bench.flstore_rounds_report import plot as rounds_plot
from bench.flstore_shapley import shapley
from bench.harness.flstore_stack import Child, FLStoreStack
from bench.harness.synthetic import SMALL_CNN, resnet18_like, write_digits_history, write_history
from bench.runinfo import PINNED_THREADS, pinned_threads, run_info, stop_on_sigterm, write_result
from cache_engine.cold_store import MinioColdStore
from core.services import MinioServer, RedisServer, free_port

log = logging.getLogger("bench.flstore")
RESULTS = Path(__file__).resolve().parent / "results"


def _fix_personalize(body: dict[str, Any], clients: dict[int, list[str]]) -> dict[str, Any]:
    if body["workload"] == "personalize":
        r = body["rounds"][0]
        body = {**body, "clients": [clients[r][0]]}
    return body


def latency(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Write the history once, then run the live query plan once per inner-product memo mode
    (``args.memo``), each on a fresh stack and fresh baselines."""
    shapes = SMALL_CNN if args.small else resnet18_like()
    d = sum(int(np.prod(s)) for s in shapes.values())
    ms = MinioServer(data_dir=work / "minio").start()
    cache_redis = CacheRedis(data_dir=work / "cache-agg-redis")
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
    cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)  # the reference reads it
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
                row = _one(client, stack, urls, label, body, first=len(rows), cold=cold)
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
            "summary": summary(rows),
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
    cold: MinioColdStore | None = None,
) -> dict[str, Any]:
    """Send one query to the three systems, system ``first`` (mod 3) of :data:`SYSTEMS`
    first, then on in turn, each asking on an idle engine (the background work a FedFaaS query
    starts is over before the next system asks: ``settle_s``, the time that took); latency
    measured at the client. With ``cold`` (the rounds in MinIO) FedFaaS's answer is also held
    to the independent reference (:mod:`bench.flstore_reference`): ``reference`` is None where
    it has none, else the keys of the answer that differ from it (empty: the same)."""
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
    row["reference"] = None
    ref = reference_from_store(cold, body) if cold is not None else None
    if ref is not None:
        ours = row["fedfaas"]["result"]
        row["reference"] = list(ref) if ours is None else agrees(ours, ref, REFERENCE_RTOL)
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
        default=4.0,
        help="the node's memory budget for the big rounds, in GB (default 4: below both "
        "rounds, 5.4 GB at 120 updates and 9.0 GB at 200)",
    )
    ap.add_argument(
        "--big-repeats",
        type=int,
        default=2,
        help="askings of each query of each system at each big-round size (default 2)",
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
        + "; a run of some of them is joined with the others' by bench.flstore_merge)",
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
    stop_on_sigterm()  # a SIGTERM still takes the platform, its cgroup and the baselines down
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
                rounds = {"run": dict(res["run"])}
                rounds["big_rounds"] = big_rounds(
                    work,
                    sizes,
                    budget,
                    args.big_repeats,
                    args.big_gtg_permutations,
                    only,
                    systems,
                )
                # a result of its own (flstore_rounds.*), written as soon as it is measured
                stored, md = write_result(rounds, "flstore_rounds", rounds_document, args.out)
                rounds_plot(stored, args.out / "flstore_rounds.png")
                sys.stdout.write(md)
    if set(res) == {"run"}:  # only the big rounds were asked for
        return
    stored, md = write_result(res, "flstore", markdown, args.out)
    plot(stored, args.out / "flstore.png")
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
