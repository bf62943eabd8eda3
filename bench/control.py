"""Control-plane benchmark: placement and re-plan speed, and the LIFL Fig. 8 ladder.

Run: ``python -m bench.control [--quick] [--out DIR]``. Writes control.{json,md,png} to DIR
(default bench/results; the .md is rendered from the .json, :func:`bench.runinfo.write_result`)
and prints the Markdown table. The process runs with every BLAS/OpenMP pool pinned to one thread
(:func:`bench.runinfo.pinned_threads`); each timed row records the threads its pools used.

(a) Placement of 10,000 clients (median / p99 over repeats) against the paper's 17 ms and the
    item-by-item implementation of the same policy run in this process.
(b) Re-plan (EWMA update of every node + :func:`replan` + :func:`diff_plans`), the whole
    re-plan of all the nodes, against the paper's 0.2 ms and the 1 ms target (a miss is
    reported as a miss, at 5 and at 100 nodes).
(d) One round of 1,000 clients selected from 10,000 enrolled: selection, placement on five
    nodes, the hierarchy's plan and the slot table sent to the gateways
    (:meth:`Coordinator.plan_round` and :func:`plan_to_slots`, what opening a round computes
    before it talks to the gateways), against the 50 ms target of issue 14.
(c) Fig. 8: five nodes (MC = 20), 20 / 60 / 100 updates, baseline SL-H (least connection,
    lazy) then +placement, +planning, +reuse, +eager. Two parts: a MODEL
    (bench.harness.lifl_sim, labelled so in the table) of the whole ladder, and (c') a run on
    five real ``python -m gateway`` processes: baseline and +placement on the gateways'
    static plan, +planning and +eager with the coordinator's plan pushed to the gateways
    (``PUT .../plan``); reuse has no switch there (each node has warm replicas of the
    ``aggregator`` function, started as the runtime starts them, ``bench.stack``). The model
    is driven by costs measured here: the aggregator's own kernel (``core.fedavg.accumulate``)
    over the model, an aggregator replica's cold start (a new Python process that imports the
    embedded watchdog and loads ``functions/aggregator/handler.py`` with it, as a replica does
    before it listens; with the default ``numpy`` kernel this imports no torch, and the JSON
    records whether torch was imported), a real loopback TCP transfer of the model (an
    inter-node hop) and a real 64-byte socket handoff (an intra-node key).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import control_plane.placement as placement_mod
from bench.harness.lifl_sim import FIG8_VARIANTS, CostModel, simulate_round
from bench.runinfo import max_pool_threads, pinned_threads, run_header, run_info, write_result
from bench.stack import GatewayProc, Replicas, start_gateway
from control_plane.placement import place
from control_plane.planning import QueueEstimator, diff_plans, plan_hierarchy, replan
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from core.services import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
PAPER_PLACEMENT_MS = 17.0
PAPER_REPLAN_MS = 0.2
TARGET_PLACEMENT_MS = 5.0
TARGET_REPLAN_MS = 1.0
TARGET_ROUND_PLANNING_MS = 50.0  # issue 14: 1,000 of 10,000 clients planned
MODEL_NAME = "MobileNetV2-sized (3,504,872 float32 parameters, one flat tensor)"
MODEL_PARAMS = 3_504_872
REPLICAS_PER_NODE = 1  # warm aggregator replicas per node in the real-gateway run
ENDPOINTS_PER_REPLICA = 2


def timeit(fn: Any, repeats: int) -> dict[str, Any]:
    fn()  # warm
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(ts)
    return {
        "median_ms": float(np.median(a)),
        "p99_ms": float(np.percentile(a, 99)),
        "repeats": repeats,
        "threads": max_pool_threads(),
    }


# ----------------------------------------------------------------------------- (a) and (b)
def bench_placement(repeats: int) -> dict[str, Any]:
    n_clients, n_nodes = 10_000, 100
    rng = np.random.default_rng(0)
    residual = np.full(n_nodes, 120.0) - rng.integers(0, 20, n_nodes)
    equal = np.ones(n_clients)
    four_jobs = rng.choice([1.0, 2.0, 0.5, 4.0], size=n_clients)  # four jobs' model sizes
    roomy = residual + 100.0  # room for the four jobs' ~18,750 units
    out: dict[str, Any] = {"clients": n_clients, "nodes": n_nodes}
    cases = {
        "bestfit_one_job": lambda: place(equal, residual, "bestfit"),
        "bestfit_four_jobs_decreasing": lambda: place(
            four_jobs, roomy, "bestfit", order="decreasing"
        ),
        "bestfit_four_jobs_arrival_order": lambda: place(four_jobs, roomy, "bestfit"),
        "bestfit_one_job_overflowing": lambda: place(equal, residual / 2, "bestfit"),
        "worstfit_one_job": lambda: place(equal, residual, "worstfit"),
        "firstfit_one_job": lambda: place(equal, residual, "firstfit"),
        "leastconn_one_job": lambda: place(equal, residual, "leastconn"),
    }
    for name, fn in cases.items():
        slow = "arrival_order" in name
        out[name] = timeit(fn, max(5, repeats // 10) if slow else repeats)
    # baseline: the same BestFit decision made item by item (the obvious implementation)
    saved = placement_mod._SHORT_RUN
    placement_mod._SHORT_RUN = 10**9
    try:
        out["bestfit_one_job_item_by_item"] = timeit(
            lambda: place(equal, residual, "bestfit"), max(5, repeats // 10)
        )
    finally:
        placement_mod._SHORT_RUN = saved
    return out


def _replan_case(n_nodes: int, per_node: int, repeats: int) -> dict[str, Any]:
    names = [f"n{i}" for i in range(n_nodes)]
    est = QueueEstimator(0.7)
    est.observe({n: float(per_node) for n in names})
    base = plan_hierarchy({n: per_node for n in names})
    delivered = {f"{n}:leaf:0": 1 for n in names}  # one update in flight on every node
    rng = np.random.default_rng(1)
    samples = [
        {n: float(x) for n, x in zip(names, rng.integers(0, 2 * per_node, n_nodes), strict=True)}
        for _ in range(8)
    ]
    i = [0]

    def step() -> None:
        est.observe(samples[i[0] % 8])
        i[0] += 1
        diff_plans(base, replan(base, est.expected_updates(), delivered))

    def ewma_only() -> None:
        est.observe(samples[i[0] % 8])
        i[0] += 1

    return {
        "nodes": n_nodes,
        # the whole re-plan of all n_nodes (the figure compared with the target)
        "replan_and_diff": timeit(step, repeats),
        # its first part alone (no target of its own)
        "ewma_estimate": timeit(ewma_only, repeats),
    }


def bench_round_planning(repeats: int) -> dict[str, Any]:
    """(d): a round of ``goal`` = 1,000 of 10,000 enrolled clients, decided as
    :meth:`Coordinator._open_round` decides it (no gateway is called)."""
    from control_plane.coordinator import Coordinator
    from control_plane.gateways import plan_to_slots
    from control_plane.jobs import JobSpec, JobState

    enrolled, goal, nodes = 10_000, 1_000, 5
    coord = Coordinator({f"node{i}": f"http://127.0.0.1:{i + 1}" for i in range(nodes)}, mc=400.0)
    job = JobState(
        JobSpec("bench", 1_000, goal, [f"c{i}" for i in range(enrolled)], overprovision=1.0)
    )
    where = coord.healthy_nodes()
    n = [0]

    def one_round() -> None:
        job.completed = n[0] % 1_000  # another round each time: another selection
        n[0] += 1
        rnd, plan = coord.plan_round(job, where)
        plan_to_slots(plan, rnd.assignment, rnd.slot_ids)

    rnd, plan = coord.plan_round(job, where)
    return {
        "enrolled": enrolled,
        "selected": len(rnd.selected),
        "nodes": nodes,
        "slots": len(plan_to_slots(plan, rnd.assignment, rnd.slot_ids)["slots"]),
        "target_ms": TARGET_ROUND_PLANNING_MS,
        "timing": timeit(one_round, repeats),
    }


def bench_replan(repeats: int) -> dict[str, Any]:
    return {
        "paper_shape_5_nodes_100_updates": _replan_case(5, 20, repeats),
        "100_nodes_10000_updates": _replan_case(100, 100, repeats),
    }


# ----------------------------------------------------------------------------- (c) costs
#: an aggregator replica's cold start: the embedded watchdog loads the function's handler exactly
#: as it does before it listens (``runtime.watchdog.load_handler``); the child prints
#: whether that imported torch, how many modules it loaded and the kernel the handler runs
COLD_START = (
    "import json, sys, pathlib; import runtime.watchdog as w; "
    "w.load_handler(pathlib.Path('functions/aggregator')); "
    "print(json.dumps({'torch': 'torch' in sys.modules, 'modules': len(sys.modules), "
    "'kernel': sys.modules['function.handler']._settings.kernel}))"
)


def measure_costs(quick: bool) -> tuple[CostModel, dict[str, Any]]:
    from core.fedavg import accumulate

    n = MODEL_PARAMS
    acc = np.zeros(n, np.float32)
    upd = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    agg = timeit(lambda: accumulate(acc, upd, 3.0), 20)["median_ms"] / 1e3

    cold_wall, cold_cpu = [], []
    root = Path(__file__).resolve().parents[1]
    # no router socket: the handler loads and its boot returns at once (no endpoint to register)
    env = {k: v for k, v in os.environ.items() if k != "FEDFAAS_GATEWAY_ROUTER_SOCKET"}
    env["PYTHONPATH"] = str(root)
    cold_loaded: dict[str, Any] = {}
    for _ in range(1 if quick else 3):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", COLD_START],
            check=True,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        cold_wall.append(time.perf_counter() - t0)
        cold_loaded = json.loads(out.stdout.strip().splitlines()[-1])
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cold_cpu.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))

    payload = np.random.default_rng(0).bytes(n * 4)
    xfer_wall, xfer_cpu = [], []
    for _ in range(3 if quick else 5):
        w, c = _tcp_transfer(payload)
        xfer_wall.append(w)
        xfer_cpu.append(c)

    a, b = socket.socketpair()
    frame = b"\0" * 64

    def ping() -> None:
        a.sendall(frame)
        b.recv(64)

    key = timeit(ping, 2000)["median_ms"] / 1e3
    a.close()
    b.close()
    costs = CostModel(
        agg_s=agg,
        cold_s=float(np.median(cold_wall)),
        cold_cpu_s=float(np.median(cold_cpu)),
        xfer_s=float(np.median(xfer_wall)),
        xfer_cpu_s=float(np.median(xfer_cpu)),
        key_s=key,
    )
    info = {
        "model": MODEL_NAME,
        "model_bytes": n * 4,
        "agg_s": "core.fedavg.accumulate (the aggregator's kernel) of one update",
        "cold_s": "a new Python process that loads functions/aggregator/handler.py through "
        "runtime.watchdog.load_handler, as a replica does before it listens (wall); "
        "cold_cpu_s its user+sys CPU",
        "cold_start_imports_torch": cold_loaded.get("torch"),
        "cold_start_modules": cold_loaded.get("modules"),
        "cold_start_kernel": cold_loaded.get("kernel"),
        "xfer_s": "loopback TCP transfer of the model bytes into a preallocated buffer (wall); "
        "xfer_cpu_s process CPU of sender+receiver",
        "key_s": "64-byte send+recv on a Unix socketpair",
    }
    return costs, info


def _tcp_transfer(payload: bytes) -> tuple[float, float]:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    buf = bytearray(len(payload))

    def recv() -> None:
        conn, _ = srv.accept()
        view, got = memoryview(buf), 0
        while got < len(buf):
            k = conn.recv_into(view[got:])
            if not k:
                break
            got += k
        conn.close()

    th = threading.Thread(target=recv)
    th.start()
    c0, t0 = time.process_time(), time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(payload)
    th.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    srv.close()
    return wall, cpu


def paper_network(costs: CostModel) -> CostModel:
    """Same costs, but an inter-node hop as slow as the paper's (ResNet-152, 232 MB, 4.2 s)."""
    rate = 232e6 / 4.2
    return CostModel(
        costs.agg_s,
        costs.cold_s,
        costs.cold_cpu_s,
        MODEL_PARAMS * 4 / rate,
        costs.xfer_cpu_s,
        costs.key_s,
    )


def bench_fig8(costs: CostModel, seeds: int, window_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (20, 60, 100):
        rows: dict[str, Any] = {}
        for v in FIG8_VARIANTS:
            res = [
                simulate_round(
                    [20.0] * 5, v, costs, np.random.default_rng(s).uniform(0, window_s, n)
                )
                for s in range(seeds)
            ]
            rows[v.name] = {
                "act_s": float(np.mean([r.act_s for r in res])),
                "cpu_s": float(np.mean([r.cpu_s for r in res])),
                "aggregators_created": int(res[0].created),
                "nodes_used": int(res[0].nodes_used),
                "cross_node_transfers": int(res[0].cross_node),
            }
        base = rows[FIG8_VARIANTS[0].name]
        for r in rows.values():
            r["act_vs_baseline"] = r["act_s"] / base["act_s"]
            r["cpu_vs_baseline"] = r["cpu_s"] / base["cpu_s"]
        out[str(n)] = rows
    return out


def real_stack_ready() -> tuple[bool, str]:
    root = Path(__file__).resolve().parents[1]
    missing = [
        p
        for p in ("gateway/__main__.py", "functions/aggregator/worker.py")
        if not (root / p).exists()
    ]
    if missing:
        return False, "not ready: " + ", ".join(missing) + " missing"
    return True, (
        f"python -m gateway x5 (userspace router), each node with {REPLICAS_PER_NODE} warm "
        f"aggregator replica(s) of {ENDPOINTS_PER_REPLICA} endpoints"
    )


REAL_LADDER = (  # name, placement policy, lazy, coordinator pushes its plan to the gateways
    ("SL-H (leastconn, lazy)", "leastconn", True, False),
    ("+placement (BestFit)", "bestfit", True, False),
    ("+planning (pushed plan)", "bestfit", True, True),
    ("+eager (BestFit, eager)", "bestfit", False, True),
)


def bench_fig8_real(sizes: tuple[int, ...], work: Path) -> dict[str, Any]:
    """Drive five real node gateways through the coordinator (placement via the job's node span)."""
    import asyncio

    from safetensors.numpy import save

    from control_plane.jobs import JobSpec
    from core.services import RedisServer, free_port

    redis = RedisServer(data_dir=work / "redis").start()
    secret = os.urandom(32).hex()
    (work / "secret").write_text(secret)
    (work / "secret").chmod(0o600)
    rng = np.random.default_rng(0)
    payloads = [save({"w": rng.standard_normal(MODEL_PARAMS).astype(np.float32)}) for _ in range(4)]
    w0 = save({"w": np.zeros(MODEL_PARAMS, np.float32)})
    out: dict[str, Any] = {}
    try:
        for n in sizes:
            rows: dict[str, Any] = {}
            for name, policy, lazy, push in REAL_LADDER:
                flush_redis(redis)  # restarted gateways must not reload earlier runs' jobs
                ports = {f"node{i}": free_port() for i in range(5)}
                shm = Path("/dev/shm") / f"fedfaas-bench-control-{os.getpid()}"
                gws: list[GatewayProc] = []
                aggs: list[Replicas] = []
                try:
                    gws, aggs = _start_nodes(work, redis, ports, shm, lazy)
                    pids = [g.pid for g in gws] + [pid for a in aggs for pid in a.pids()]
                    urls = {k: f"http://127.0.0.1:{v}" for k, v in ports.items()}
                    job = f"fig8-{n}-{policy}-{'lazy' if lazy else 'eager'}"
                    spec = JobSpec(job, 5, n, [f"c{i}" for i in range(n)], 1.0, 600.0, policy)
                    rows[name] = asyncio.run(
                        _real_round(urls, secret, spec, w0, payloads, pids, push)
                    )
                except Exception as exc:  # record and go on: one bad run must not lose the rest
                    rows[name] = {"error": repr(exc)[:300]}
                finally:
                    for a in aggs:
                        a.stop()
                    for g in gws:
                        g.stop()
                    subprocess.run(["rm", "-rf", str(shm)], check=False)
            base = rows[REAL_LADDER[0][0]]
            for r in rows.values():
                if "error" not in r and "error" not in base:
                    r["act_vs_baseline"] = r["act_s"] / base["act_s"]
                    r["cpu_vs_baseline"] = r["cpu_s"] / base["cpu_s"]
            out[str(n)] = rows
    finally:
        redis.stop()
    return out


def flush_redis(rs: RedisServer) -> None:
    client = rs.client()
    client.flushall()
    client.close()


def _start_nodes(
    work: Path, rs: RedisServer, ports: dict[str, int], shm: Path, lazy: bool
) -> tuple[list[GatewayProc], list[Replicas]]:
    """Five node gateways (``GatewaySettings.to_argv``, userspace router) and, on each node,
    ``REPLICAS_PER_NODE`` warm ``aggregator`` replicas registered with its router."""
    gws: list[GatewayProc] = []
    aggs: list[Replicas] = []
    try:
        for node, port in ports.items():
            settings = GatewaySettings(
                node=node,
                port=port,
                state_dir=work / node,
                redis_url=rs.url,
                redis_credentials_file=rs.credentials_file("gateway"),
                shm_root=shm,
                prefer_ebpf=False,
                admin_secret_file=work / "secret",
                lazy=lazy,
                peers={o: f"http://127.0.0.1:{p}" for o, p in ports.items() if o != node},
            )
            gws.append(start_gateway(settings, work / f"{node}.log", wait=False))
        for gw in gws:
            gw.wait_ready()
            replicas = Replicas(gw)
            aggs.append(replicas)
            replicas.spawn(REPLICAS_PER_NODE, ENDPOINTS_PER_REPLICA)
        for replicas in aggs:
            replicas.wait_registered(REPLICAS_PER_NODE * ENDPOINTS_PER_REPLICA)
    except BaseException:
        for a in aggs:
            a.stop()
        for g in gws:
            g.stop()
        raise
    return gws, aggs


def _tree_cpu(pids: list[int]) -> float:
    """User+system CPU seconds of the processes and all their children."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            ps = psutil.Process(pid)
            for q in [ps, *ps.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


async def _real_round(
    urls: dict[str, str],
    secret: str,
    spec: Any,
    w0: bytes,
    payloads: list[bytes],
    pids: list[int],
    push: bool = True,
) -> dict[str, Any]:
    import asyncio

    import httpx

    from control_plane.coordinator import Coordinator
    from control_plane.gateways import plan_to_slots

    coord = Coordinator(urls, mc=20.0, admin_token=secret, auto_rounds=False, push_plans=push)
    await coord.start()
    try:
        job = await coord.create_job(spec, initial_weights=w0)
        rnd = job.current
        assert rnd is not None
        span = sorted(set(rnd.assignment.values()))
        slots = plan_to_slots(coord.plans[spec.name], rnd.assignment, dict(rnd.slot_ids))
        root = urls[coord._job_span(spec, coord.healthy_nodes())[0]]
        sem = asyncio.Semaphore(16)
        acts, ingests, tails, cpus, gw_acts = [], [], [], [], []
        tokens = coord.client_tokens(spec.name)
        admin = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(timeout=300, headers=admin) as http:

            async def one(rn: int, i: int, c: str) -> None:
                url = urls[rnd.assignment[c]]
                tok = tokens[c]
                async with sem:
                    r = await http.post(
                        f"{url}/v1/jobs/{spec.name}/rounds/{rn}/updates",
                        content=payloads[(i + rn) % 4],
                        headers={
                            "X-Client-Id": c,
                            "X-Sample-Count": str(1 + i % 7),
                            "Authorization": f"Bearer {tok}",
                        },
                    )
                if r.status_code != 202:
                    raise RuntimeError(f"upload {c} round {rn}: {r.status_code} {r.text[:200]}")

            for rn in range(1, spec.rounds + 1):  # every round is one repeat of the experiment
                for node in span:  # every node of the job must have opened the round
                    while (await http.get(f"{urls[node]}/v1/jobs/{spec.name}")).json().get(
                        "round"
                    ) != rn:
                        await asyncio.sleep(0.005)
                if (
                    rn > 1 and push
                ):  # the coordinator's plan for this repeat too (the gateways run it)
                    for node in coord.healthy_nodes():
                        await coord.clients[node].put_plan(spec.name, rn, slots)
                cpu0 = _tree_cpu(pids)
                t0 = time.perf_counter()
                await asyncio.gather(*(one(rn, i, c) for i, c in enumerate(rnd.selected)))
                t_ingested = time.perf_counter()
                while True:
                    st = (await http.get(f"{root}/v1/jobs/{spec.name}")).json()
                    if st.get("version", 0) >= rn:
                        break
                    if time.perf_counter() - t0 > 300:
                        raise RuntimeError(f"round {rn} of {spec.name} not published: {st}")
                    await asyncio.sleep(0.005)
                t_pub = time.perf_counter()
                cpus.append(_tree_cpu(pids) - cpu0)
                acts.append(t_pub - t0)
                ingests.append(t_ingested - t0)
                tails.append(t_pub - t_ingested)
                gw_acts.append((st.get("last_round") or {}).get("first_byte_to_result_s"))
        return {
            "act_s": float(np.median(acts)),
            "ingest_s": float(np.median(ingests)),
            "after_last_upload_s": float(np.median(tails)),
            "cpu_s": float(np.median(cpus)),
            "gateway_first_byte_to_result_s": gw_acts,
            "repeats": len(acts),
            "aggregator_tasks": len(slots["slots"])
            if rnd.placement == "coordinator"
            else job.gateway_slots or None,
            "nodes_used": len(span),
            "placement": rnd.placement,
        }
    finally:
        await coord.stop()


# ----------------------------------------------------------------------------- report
def verdict(median_ms: float, target_ms: float) -> str:
    """``meets <= T ms`` or ``MISSES <= T ms`` for a whole measured figure against its target."""
    return f"{'meets' if median_ms <= target_ms else 'MISSES'} <= {target_ms:g} ms"


def vs_paper(median_ms: float, paper_ms: float) -> str:
    """``N.Nx faster than P ms`` or ``N.Nx SLOWER than P ms``."""
    if median_ms <= paper_ms:
        return f"{paper_ms / median_ms:.1f}x faster than {paper_ms:g} ms"
    return f"{median_ms / paper_ms:.1f}x SLOWER than {paper_ms:g} ms"


def to_markdown(r: dict[str, Any]) -> str:
    """The Markdown report, rendered from the result JSON (``write_result`` reads it back)."""
    t_place, t_replan = r["targets"]["placement_ms"], r["targets"]["replan_ms"]
    p_place, p_replan = r["paper"]["placement_ms"], r["paper"]["replan_ms"]
    lines = [
        "# Control-plane benchmark",
        "",
        run_header(r["run"]),
        "",
        f"Placement: {r['placement']['clients']} clients on {r['placement']['nodes']} nodes.",
        "",
        "## (a) Placement of 10,000 clients and (b) re-plan",
        "",
        "Verdicts use the median of the whole operation (a re-plan is every node's EWMA update, "
        "the re-plan and the diff, for all the nodes: never divided per node); p99 on a shared "
        "machine includes preemption by other work. threads: the most threads any BLAS/OpenMP "
        "pool of the process used during the row.",
        "",
        "| case | median ms | p99 ms | threads | vs paper | vs target |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, v in r["placement"].items():
        if isinstance(v, dict):
            lines.append(
                f"| place {k} | {v['median_ms']:.3f} | {v['p99_ms']:.3f} | {v['threads']} | "
                f"{vs_paper(v['median_ms'], p_place)} | "
                f"{verdict(v['median_ms'], t_place)} |"
            )
    for k, v in r["replan"].items():
        t = v["replan_and_diff"]
        lines.append(
            f"| whole re-plan + diff, {k} | {t['median_ms']:.4f} | {t['p99_ms']:.4f} | "
            f"{t['threads']} | {vs_paper(t['median_ms'], p_replan)} | "
            f"{verdict(t['median_ms'], t_replan)} |"
        )
        e = v["ewma_estimate"]
        lines.append(
            f"| its EWMA update alone, {k} | {e['median_ms']:.4f} | {e['p99_ms']:.4f} | "
            f"{e['threads']} | (part of the row above) | (no target of its own) |"
        )
    base = r["placement"]["bestfit_one_job_item_by_item"]["median_ms"]
    fast = r["placement"]["bestfit_one_job"]["median_ms"]
    lines += [
        "",
        f"Vectorised BestFit vs the item-by-item loop of the same policy: {base / fast:.1f}x.",
        "",
    ]
    rp = r.get("round_planning")
    if rp:
        t = rp["timing"]
        lines += [
            f"## (d) One round of {rp['selected']:,} clients selected from {rp['enrolled']:,} "
            "enrolled",
            "",
            f"Selection, placement on {rp['nodes']} nodes, the hierarchy's plan "
            f"({rp['slots']} slots) and the slot table the gateways get: what opening a round "
            "computes before it calls them (`Coordinator.plan_round`).",
            "",
            "| case | median ms | p99 ms | threads | vs target |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| plan one round | {t['median_ms']:.3f} | {t['p99_ms']:.3f} | {t['threads']} | "
            f"{verdict(t['median_ms'], rp['target_ms'])} |",
            "",
        ]
    c = r["fig8"]["costs"]
    lines += [
        "## (c) Fig. 8 ladder: five nodes, MC = 20 (MODEL with measured costs)",
        "",
        f"**This part is a model, not an end-to-end run** ({r['fig8']['real_stack']}). "
        f"Model: {r['fig8']['model']} ({r['fig8']['model_bytes'] / 1e6:.1f} MB); updates arrive "
        f"uniformly over {r['fig8']['window_s']} s; mean over {r['fig8']['seeds']} seeds.",
        f"Measured costs: aggregate one update {c['agg_s'] * 1e3:.2f} ms; replica cold start "
        f"{c['cold_s']:.2f} s wall / {c['cold_cpu_s']:.2f} s CPU (load of the aggregator's "
        f"handler by the watchdog; imports torch: "
        f"{r['fig8']['cost_sources']['cold_start_imports_torch']}); inter-node transfer "
        f"{c['xfer_s'] * 1e3:.1f} ms wall / {c['xfer_cpu_s'] * 1e3:.1f} ms CPU; key handoff "
        f"{c['key_s'] * 1e6:.1f} us.",
        "",
        "| updates | variant | ACT s | ACT vs SL-H | CPU s | CPU vs SL-H | aggregators created | nodes used | cross-node |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    header = lines[-2:]
    for key in ("results", "results_paper_network"):
        if key == "results_paper_network":
            lines += [
                "",
                "Same model, inter-node hop as slow as the paper's testbed "
                f"(232 MB in 4.2 s, so {r['fig8']['paper_network_xfer_s']:.2f} s for this model):",
                "",
                *header,
            ]
        for n, rows in r["fig8"][key].items():
            for name, x in rows.items():
                if "act_vs_baseline" not in x:
                    lines.append(f"| {n} | {name} | failed: {x.get('error', 'no baseline')} |")
                    continue
                lines.append(
                    f"| {n} | {name} | {x['act_s']:.3f} | {x['act_vs_baseline']:.2f} | "
                    f"{x['cpu_s']:.2f} | {x['cpu_vs_baseline']:.2f} | {x['aggregators_created']} | "
                    f"{x['nodes_used']} | {x['cross_node_transfers']} |"
                )
    real = r.get("fig8_real", {})
    lines += ["", "## (c') Fig. 8 on real node gateways (placement and eager/lazy)", ""]
    if not real.get("ran"):
        lines.append(f"Not run: {real.get('why')}.")
    else:
        lines += [
            f"Five `python -m gateway` processes on this machine ({real['setup']}), one shared Redis; "
            f"the coordinator places the round and creates the job on the nodes it uses (on all "
            "five when it pushes its plan); "
            f"{real['model']}; all updates uploaded at once (16 in flight). ACT = first upload "
            "to model published. CPU = gateways + aggregator replicas. The first two rows run the "
            "gateways' static plan; from +planning on the coordinator pushes its plan (PUT "
            ".../plan). Reuse is not a switch on real gateways: the aggregator replicas are warm "
            "endpoints that the gateways grant any slot (the +reuse row exists only in the model above).",
            "",
            "| updates | variant | ACT s | ACT vs SL-H | after last upload s | CPU s | CPU vs SL-H | aggregator tasks | nodes used |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for n, rows in real["results"].items():
            for name, x in rows.items():
                if "act_vs_baseline" not in x:
                    lines.append(f"| {n} | {name} | failed: {x.get('error', 'no baseline')} |")
                    continue
                lines.append(
                    f"| {n} | {name} | {x['act_s']:.3f} | {x['act_vs_baseline']:.2f} | "
                    f"{x['after_last_upload_s']:.3f} | {x['cpu_s']:.2f} | "
                    f"{x['cpu_vs_baseline']:.2f} | {x['aggregator_tasks']} | {x['nodes_used']} |"
                )
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = r.get("fig8_real", {})
    panels = [
        (r["fig8"]["results"], "model, loopback hop", "aggregators_created"),
        (r["fig8"]["results_paper_network"], "model, paper-speed hop", "aggregators_created"),
    ]
    if real.get("ran"):
        panels.append((real["results"], "REAL gateways", "aggregator_tasks"))
    fig, grid = plt.subplots(len(panels), 4, figsize=(18, 4 * len(panels)), squeeze=False)
    for axes, (res, label, count_key) in zip(grid, panels, strict=True):
        ns = sorted(res, key=int)
        ladder = [v.name for v in FIG8_VARIANTS] + [x[0] for x in REAL_LADDER]
        names = sorted(res[ns[0]], key=lambda k: ladder.index(k) if k in ladder else len(ladder))
        for ax, key, title in zip(
            axes,
            ("act_s", "cpu_s", count_key, "nodes_used"),
            ("ACT (s)", "CPU time (s)", count_key.replace("_", " "), "nodes used"),
            strict=True,
        ):
            width = 0.8 / len(names)
            for i, name in enumerate(names):
                vals = [res[n][name].get(key) or 0 for n in ns]
                ax.bar(np.arange(len(ns)) + i * width, vals, width, label=name)
            ax.set_xticks(np.arange(len(ns)) + 0.4 - width / 2, ns)
            ax.set_xlabel("concurrent updates")
            ax.set_title(f"{title}, {label}")
        axes[0].legend(fontsize=7)
    fig.suptitle(
        "LIFL Fig. 8 ladder on this machine: model rows driven by measured costs, real row"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.control")
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the result files")
    p.add_argument("--window", type=float, default=1.0, help="arrival window of the updates (s)")
    p.add_argument("--no-real", action="store_true", help="skip the run on real gateways")
    args = p.parse_args(argv)
    with pinned_threads(1):
        return _run(args, sys.argv[1:] if argv is None else argv)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    run = run_info("bench.control", argv)  # as the run starts
    repeats = 50 if args.quick else 300
    ready, why = real_stack_ready()
    costs, cost_info = measure_costs(args.quick)
    seeds = 5 if args.quick else 20
    result = {
        "run": run,
        "placement": bench_placement(repeats),
        "replan": bench_replan(repeats),
        "round_planning": bench_round_planning(repeats),
        "paper": {"placement_ms": PAPER_PLACEMENT_MS, "replan_ms": PAPER_REPLAN_MS},
        "targets": {"placement_ms": TARGET_PLACEMENT_MS, "replan_ms": TARGET_REPLAN_MS},
        "fig8": {
            "mode": "model",
            "real_stack": "the real-gateway run is fig8_real (placement and "
            "eager/lazy only: the nodes' aggregator replicas are warm, so planning and reuse "
            "cannot be switched there)",
            "model": MODEL_NAME,
            "model_bytes": MODEL_PARAMS * 4,
            "window_s": args.window,
            "seeds": seeds,
            "mc": 20,
            "nodes": 5,
            "costs": costs.__dict__,
            "cost_sources": cost_info,
            "results": bench_fig8(costs, seeds, args.window),
            "paper_network_xfer_s": paper_network(costs).xfer_s,
            "results_paper_network": bench_fig8(paper_network(costs), seeds, args.window),
        },
    }
    real: dict[str, Any] = {"ran": False, "why": why if not ready else "skipped (--no-real)"}
    if ready and not args.no_real:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
            real = {
                "ran": True,
                "setup": why,
                "model": MODEL_NAME,
                "results": bench_fig8_real((20, 60, 100), Path(tmp)),
            }
    result["fig8_real"] = real
    stored, md = write_result(result, "control", to_markdown, args.out)
    plot(stored, args.out / "control.png")
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
