"""One FedFaaS round for the benchmarks, measured as the baselines' rounds are.

:func:`bench_round_e2e` runs ``clients`` SDK client processes against one node gateway (its own
Redis) whose warm ``aggregator`` replicas aggregate, measured with
:mod:`bench.harness.round_window` (the same window marks, first bytes and memory guard as
Flower's and SF's rounds) and, given a :class:`~bench.harness.cgroups.RoundGroups`, by cgroup:
the gateway, the replicas and Redis are born in the server group (pinned to its cpuset), the
clients in the client group. :func:`design_floor` is the memory the design needs at least,
computed from the round's settings. :func:`start_bench_gateway` and :func:`create_job` are the
gateway helpers ``bench.dataplane`` uses too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.cgroups import born_in
from bench.harness.sdk_client import UPLOADS
from bench.runinfo import PINNED_THREADS, ROOT
from bench.stack import GatewayProc, Replicas, start_gateway
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups
    from core.services import RedisServer

#: copies of the global model the design holds once a round is published: the sealed object
#: and its encoded safetensors body that ``GET model`` serves
PUBLISHED_COPIES = 2


def design_floor(
    model_bytes: int,
    *,
    clients: int,
    max_inflight: int,
    replicas: int,
    endpoints: int,
    idle_bytes: int,
) -> dict[str, int]:
    """The least server memory FedFaaS's design needs for one round, from its settings: the
    uploads in flight at once (``max_inflight``, every client when it is 0: no limit), one
    accumulator per aggregator endpoint folding at once plus the top's, the published global
    (:data:`PUBLISHED_COPIES`), on top of the processes' idle baseline ``idle_bytes`` (measured
    before the job exists). Each object is ``model_bytes``. Returns the parts and their sum
    (``bytes``)."""
    if min(model_bytes, clients, replicas, endpoints) < 1 or max_inflight < 0 or idle_bytes < 0:
        raise ValueError(
            f"need model_bytes, clients, replicas, endpoints >= 1 and max_inflight, idle_bytes "
            f">= 0: {model_bytes}, {clients}, {replicas}, {endpoints}, {max_inflight}, "
            f"{idle_bytes}"
        )
    inflight = min(max_inflight, clients) if max_inflight else clients
    parts = {
        "in_flight_uploads": inflight * model_bytes,
        "accumulators": (replicas * endpoints + 1) * model_bytes,
        "published_global": PUBLISHED_COPIES * model_bytes,
        "idle_processes": idle_bytes,
    }
    return {"bytes": sum(parts.values()), **parts}


def start_bench_gateway(
    work: Path, rs: RedisServer, node: str, *, ebpf: bool, **extra: Any
) -> GatewayProc:
    """A ``python -m gateway`` for node ``node`` on a free port, on Redis ``rs``, its store under
    ``/dev/shm/fedfaas-bench-<pid>-<node>``; its command line is the one
    ``GatewaySettings.to_argv`` renders (``extra``: more settings)."""
    from core.services import free_port

    settings = GatewaySettings(
        node=node,
        port=free_port(),
        state_dir=work / f"gw-{node}",
        redis_url=rs.url,
        redis_credentials_file=rs.credentials_file("gateway"),
        shm_root=Path(f"/dev/shm/fedfaas-bench-{os.getpid()}-{node}"),
        prefer_ebpf=ebpf,
        **extra,
    )
    return start_gateway(settings, work / f"gw-{node}.log")


def create_job(
    port: int, secret: str, job: str, clients: list[str], goal: int, body: bytes
) -> dict[str, Any]:
    """Create one-round job ``job`` (``clients``, ``goal`` updates, initial model ``body``) on
    the gateway at ``port``; its answer (the clients' tokens under ``tokens``)."""
    import httpx

    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/jobs",
        content=body,
        timeout=120,
        params={"job": job, "rounds": 1, "goal": goal, "clients": ",".join(clients)},
        headers={"Authorization": f"Bearer {secret}"},
    )
    if r.is_error:  # the gateway's JSON error says what was wrong
        raise RuntimeError(f"creating job {job} answered {r.status_code}: {r.text[:500]}")
    return dict(r.json())


def bench_round_e2e(
    work: Path,
    layout: list[tuple[str, list[int]]],
    clients: int,
    *,
    ebpf: bool,
    fanout: int = 2,
    max_inflight: int = 4,
    replicas: int = 1,
    endpoints: int = 2,
    mem_limit_bytes: int = 0,
    floor_bytes: int | None = None,
    timeout: float = 600.0,
    tag: str = "",
    gateway: dict[str, Any] | None = None,
    aggregator_env: dict[str, str] | None = None,
    groups: RoundGroups | None = None,
    weights: Sequence[Path] | None = None,
    initial: bytes | None = None,
    keep_model: bool = False,
    upload: str = "stream",
) -> dict[str, Any]:
    """One FedFaaS round measured as :func:`bench.flower_baseline.run_flower_round` measures
    Flower's (:mod:`bench.harness.round_window`): ``clients`` client processes on this machine,
    released at once, each uploading its weights through the SDK
    (:mod:`bench.harness.sdk_client`; ``upload``: serialised as they are sent, or first) to
    one node gateway (its own Redis) whose round warm ``aggregator`` replicas aggregate.

    ``e2e_s``: first client's weights-in-memory mark -> global model published (encoded and
    served by the gateway); ``server_s``: first update bytes received on the gateway's port ->
    the same end; ``server_peak_bytes``: the peak of the gateway's, the replicas' and Redis's
    memory with the object store counted once (:class:`~bench.harness.round_window.PeakMemory`);
    ``server_hwm_bytes``: their summed ``VmHWM`` (an upper bound). A point the memory
    guard stops, that errors or times out is a failure record (``ok`` False), not an
    exception. ``gateway``: more :class:`~gateway.settings.GatewaySettings` fields (default:
    the gateway's own defaults); ``aggregator_env``: more environment for the replicas.
    ``weights``: one file per client in :func:`~bench.harness.rc.write_weights`'s
    layout (None: one random file every client shares); ``initial``: the job's initial model
    as the body ``POST /v1/jobs`` takes (safetensors, its metadata may name an aggregation
    rule; None: zeros); ``keep_model``: the record's ``model`` is the published global model
    as one flat float32 vector in the layout's order (not JSON). ``upload``: what each
    client gives the SDK (:data:`bench.harness.sdk_client.UPLOADS`): ``"stream"`` its state
    dict, written as safetensors while it is sent; ``"bytes"`` the safetensors bytes,
    serialised first inside the window (``encode_s_max`` then says how long that took).

    ``groups``: the round's cgroups. The gateway, the replicas and Redis are born in
    ``groups.server``, the clients in ``groups.clients``; the record then has ``cgroup``
    (each group's peak memory, CPU-seconds and threads over the server window,
    :meth:`~bench.harness.cgroups.RoundGroups.close_window`), ``server_baseline_bytes`` (the
    server group's memory once every process is up, before the job exists) and
    ``design_floor`` (:func:`design_floor` over that baseline).
    """
    import httpx
    from safetensors.numpy import save

    from bench.harness import round_clients as rc
    from bench.harness import round_window as rw
    from core.services import RedisServer

    if upload not in UPLOADS:
        raise ValueError(f"upload must be one of {UPLOADS}, not {upload!r}")
    floor = rw.DEFAULT_FLOOR_BYTES if floor_bytes is None else floor_bytes
    size = rc.layout_bytes(layout)
    # short: the node names the round's folder, its gateway's folder under it and its router
    # socket in that (an AF_UNIX path: 107 bytes at most)
    node = f"n{tag}{'e' if ebpf else 'u'}{clients}c{size // 1_000_000}m"
    base = {"clients": clients, "update_bytes": size, "num_tensors": len(layout)}
    rdir = work / node
    rdir.mkdir(parents=True)
    (rdir / "layout.json").write_text(json.dumps(layout))
    shared = Path(f"/dev/shm/fedfaas-bench-weights-{os.getpid()}-{node}")
    server_group = groups.server if groups else None
    with born_in(server_group):
        redis = RedisServer(data_dir=rdir / "redis").start()
    gw: GatewayProc | None = None
    aggs: Replicas | None = None
    procs: list[subprocess.Popen[bytes]] = []
    guard: rw.MemoryGuard | None = None
    first: rw.FirstBytes | None = None
    peak: rw.PeakMemory | None = None

    def server_pids() -> list[int]:
        return [p for p in (redis.proc.pid if redis.proc else None, gw and gw.pid) if p] + (
            aggs.pids() if aggs else []
        )

    def kill_all() -> None:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for pid in rw.tree(server_pids()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    acct: dict[str, Any] | None = None
    try:
        with born_in(server_group):
            gw = start_bench_gateway(
                rdir,
                redis,
                node,
                ebpf=ebpf,
                fanout=fanout,
                max_inflight=max_inflight,
                **(gateway or {}),
            )
            aggs = Replicas(gw, rdir / "aggregators")
            aggs.spawn(replicas, endpoints, env=aggregator_env)
        health = gw.health()
        aggs.wait_registered(replicas * endpoints)
        baseline = server_group.memory_bytes() if server_group else 0
        guard = rw.MemoryGuard(
            server_pids,
            kill_all,
            client_pids=lambda: [p.pid for p in procs],
            limit_bytes=mem_limit_bytes,
            floor_bytes=floor,
        )
        guard.start()
        names = [f"c{k}" for k in range(clients)]
        job = f"e2e-{node}"
        init = initial or save({n: np.zeros(s, np.float32) for n, s in layout})
        info = create_job(gw.settings.port, gw.secret(), job, names, clients, init)
        del init
        if weights is None:
            rc.write_weights(shared, layout)
        if weights is not None and len(weights) != clients:
            raise ValueError(f"{len(weights)} weight files for {clients} clients")
        for k, name in enumerate(names):
            sp = rdir / f"client-{k}.json"
            sp.write_text(
                json.dumps(
                    {
                        "work": str(rdir),
                        "weights": str(shared if weights is None else weights[k]),
                        "url": gw.url,
                        "job": job,
                        "client": name,
                        "token": info["tokens"][name],
                        "samples": 100 + k,
                        "upload": upload,
                    }
                )
            )
            argv = [sys.executable, "-m", "bench.harness.sdk_client"]
            with (
                open(rdir / f"client-{k}.log", "wb") as log,
                born_in(groups.clients if groups else None),
            ):
                procs.append(
                    subprocess.Popen(
                        [*argv, "--spec", str(sp), "--out", str(rdir / f"client-{k}.out")],
                        cwd=ROOT,
                        env={**os.environ, **PINNED_THREADS, "PYTHONPATH": str(ROOT)},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + timeout

        def check() -> dict[str, Any] | None:
            assert gw is not None
            return rw.point_failure(
                guard,
                ("gateway", gw.proc, gw.log_path),
                [(c, rdir / f"client-{k}.log") for k, c in enumerate(procs)],
                deadline,
                f"no global model in {timeout:.0f} s",
                server_may_finish=False,
                **base,
            )

        while len(list(rdir.glob("ready-*"))) < clients:
            if (bad := check()) is not None:
                return bad
            time.sleep(0.01)
        idle = rw.summed_rss(server_pids())
        rw.reset_hwm(server_pids())  # the peak of the window, not of the job's creation
        if groups is not None:
            groups.open_window()
        peak = rw.PeakMemory(server_pids, [gw.settings.shm_root])
        peak.start()
        first = rw.FirstBytes(gw.settings.port)
        first.start()
        (rdir / "go").touch()
        # the uploads first: no status request touches the gateway's port before they are in
        while any(p.poll() is None for p in procs):
            if (bad := check()) is not None:
                return bad
            time.sleep(0.02)
        auth = {"Authorization": f"Bearer {gw.secret()}"}
        while True:
            if (bad := check()) is not None:
                return bad
            st = httpx.get(f"{gw.url}/v1/jobs/{job}", headers=auth, timeout=30).json()
            if st["last_round"] and st["last_round"]["published_ns"]:
                break
            time.sleep(0.02)
        hwm = rw.summed_hwm(server_pids())  # at the end, every server process still running
        acct = groups.close_window() if groups is not None else None
        peak.stop()
        router = gw.router()
        model = _published(gw, job, layout) if keep_model else None
        marks = [json.loads((rdir / f"client-{k}.out").read_text()) for k in range(clients)]
    except Exception:
        # a request to a server the guard has just stopped: the guard's record is the result
        if guard is not None and guard.tripped is not None:
            return guard.failure(**base)
        raise
    finally:
        if first is not None:
            first.stop()
        if peak is not None:
            peak.stop()
        if guard is not None:
            guard.stop()
        kill_all()
        if aggs is not None:
            aggs.stop()
        if gw is not None:
            gw.stop()
            # the store the gateway leaves (the global model; every object if it was killed)
            shutil.rmtree(gw.settings.shm_root, ignore_errors=True)
        redis.stop()
        shared.unlink(missing_ok=True)
    lr = st["last_round"]
    end = lr["published_ns"]
    function_eps = [e for e in router["endpoints"] if not e["local"]]
    out = {
        "ok": True,
        **base,
        "method": (
            "window: first client's weights-in-memory mark (before serialisation) -> global "
            "model published; server window from the first update bytes received on the "
            "gateway's port (kernel TCP counters); memory: peak over the window of the "
            "gateway's, aggregator replicas' and Redis's private and file pages plus the "
            "object store's pages once, sampled every 5 ms (beside it the summed VmHWM, which "
            "counts the store once per process mapping it)"
        ),
        "fanout": fanout,
        "max_inflight": max_inflight,
        "upload": upload,
        "router": router["mode"],
        "router_reason": health["router_reason"],
        "aggregator_replicas": replicas,
        "endpoints_per_replica": endpoints,
        "endpoints_granted": sum(1 for e in function_eps if e["job"] == info["id"]),
        "router_frames": sum((e["metrics"] or {}).get("msgs_sent", 0) for e in router["endpoints"]),
        "router_drops": router["drops"],
        "e2e_s": rw.window_s([m["t_start_ns"] for m in marks], end),
        "server_s": first.server_window_s(end),
        # the gateway's own first-byte mark, a cross-check of ``server_s``
        "server_gateway_mark_s": rw.window_s([lr["first_byte_ns"]], end),
        "encode_s_max": max(m["t_encoded_ns"] - m["t_start_ns"] for m in marks) / 1e9,
        "act_s": (lr["result_ns"] - lr["first_byte_ns"]) / 1e9,
        "ingest_s": (lr["last_update_ns"] - lr["first_byte_ns"]) / 1e9,
        "after_ingest_s": (lr["result_ns"] - lr["last_update_ns"]) / 1e9,
        # the round's tail: the last update sealed -> the global model published (encoded)
        "last_update_to_published_s": (lr["published_ns"] - lr["last_update_ns"]) / 1e9,
        **rw.sampled_memory(peak, hwm, idle, guard),
        "client_hwm_bytes": sum(int(m["client_hwm_bytes"]) for m in marks),
        # BLAS/OpenMP pools a client measured at the end (threadpoolctl); the gateway and the
        # replicas are started with the pinned environment (``threads_env``)
        "thread_pools": {"client": marks[0]["thread_pools"]},
        "threads_env": dict(PINNED_THREADS),
        "store": st["store_stats"],
    }
    if acct is not None:
        out["cgroup"] = acct
        out["server_baseline_bytes"] = baseline
        out["design_floor"] = design_floor(
            size,
            clients=clients,
            max_inflight=max_inflight,
            replicas=replicas,
            endpoints=endpoints,
            idle_bytes=baseline,
        )
    out["act_over_ingest"] = out["act_s"] / out["ingest_s"] if out["ingest_s"] else None
    if model is not None:
        out["model"] = model
    return out


def _published(gw: GatewayProc, job: str, layout: list[tuple[str, list[int]]]) -> Any:
    """The job's published global model as one flat float32 vector in ``layout``'s order."""
    import httpx
    from safetensors.numpy import load

    r = httpx.get(
        f"{gw.url}/v1/jobs/{job}/model",
        headers={"Authorization": f"Bearer {gw.secret()}"},
        timeout=120,
    )
    r.raise_for_status()
    tensors = load(r.content)
    return np.concatenate([tensors[n].ravel() for n, _ in layout]).astype(np.float32)
