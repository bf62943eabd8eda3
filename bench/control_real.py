"""bench-control's Fig. 8 on the real stack: node gateways, aggregator replicas and the control
plane as processes, the placement policies on the LIFL ladder (:func:`bench_fig8_real`)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.stack import GatewayProc, Replicas, start_gateway
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from core.services import RedisServer


REPLICAS_PER_NODE = 1  # warm aggregator replicas per node
ENDPOINTS_PER_REPLICA = 2


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


def bench_fig8_real(sizes: tuple[int, ...], work: Path, model_params: int) -> dict[str, Any]:
    """Drive five real node gateways through the coordinator (placement via the job's node span),
    with updates of ``model_params`` float32."""
    import asyncio

    from safetensors.numpy import save

    from control_plane.jobs import JobSpec
    from core.services import RedisServer, free_port

    redis = RedisServer(data_dir=work / "redis").start()
    secret = os.urandom(32).hex()
    (work / "secret").write_text(secret)
    (work / "secret").chmod(0o600)
    rng = np.random.default_rng(0)
    payloads = [save({"w": rng.standard_normal(model_params).astype(np.float32)}) for _ in range(4)]
    w0 = save({"w": np.zeros(model_params, np.float32)})
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
