"""Flower baseline: one round of a real Flower deployment and N real clients on loopback.

The peer FedFaaS's data plane is measured against (DESIGN.md, "What fast means here"), run the
way Flower's documentation recommends today: Flower 1.42 (the newest the package registry
serves here, in its own environment, :mod:`bench.harness.flower_env`), its Deployment Runtime
(a ``flower-superlink`` and ``num_clients`` ``flower-supernode`` processes on loopback, the run
started with ``flwr run``), and a ``ServerApp`` and ``ClientApp`` on the Message API
(:mod:`bench.harness.flower_app`): the strategy (``FedAvg``; ``FedMedian`` or ``Krum`` for the
robust rows) runs one round through its ``start`` method. Every client's "trained weights"
are float32 numpy arrays laid out like ResNet-18's floating-point state dict (or that layout
scaled to another size, :func:`bench.harness.rc.scaled_layout`), mapped from one file
on /dev/shm that all clients share (or one file per client), every page touched before the
round. The model the ServerApp sends the clients carries no tensors (they return their own
weights; FedFaaS's clients in the same benchmark download none either).

The server side is the SuperLink and what it starts (its SuperExec and the ``flwr-serverapp``
process that runs the strategy); the clients' side the SuperNodes and their ClientApps.

This is the deployment Flower 1.42's own guide sets up ("Run Flower with the Deployment
Engine": one SuperLink, one SuperNode per client, ``flwr run``), checked against its source:

- isolation ``subprocess`` (the default of both): each SuperNode starts a ``flower-superexec``
  that launches one ``flwr-clientapp`` process per message it receives (``run_clientapp``
  pulls one message, runs the app, pushes the reply and exits), so a round of N clients has N
  ClientApp processes, whatever the isolation: ``process`` only moves the SuperExec out of the
  SuperNode. Three processes per client (SuperNode, SuperExec, ClientApp) are Flower's design;
  the apps import numpy and Flower only (no torch);
- a message moves as objects (each array, and each 5 MB chunk of it,
  ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``; over 200 for ResNet-18's state dict), one HTTP request
  each: ClientApp -> SuperNode, SuperNode -> SuperLink (its Fleet API), SuperLink -> ServerApp (its
  Runtime API), all through the SuperLink's single uvicorn worker (``workers=1``, fixed in
  ``flower_superlink``). The ServerApp learns of a reply at its next poll (every 3 s) and pulls
  its objects as soon as the reply is registered, retrying an object not yet pushed after 1, 2,
  4, 8 and then every 10 s (``PULL_INITIAL_BACKOFF``, ``PULL_BACKOFF_CAP``);
- Flower recommends its Simulation Runtime for many clients on one machine, but there the
  updates never cross a network or the SuperLink: not the peer of a server that receives N
  uploads. The Deployment Runtime it is.

``tests/bench/test_flower_deployment.py`` reads these defaults from the Flower it runs.

Measured as FedFaaS's round is (:mod:`bench.harness.round_window`):

- ``e2e_s``: from the first client's "weights in memory as arrays" mark (in ``train``, after a
  barrier that releases all clients at once, before Flower serialises anything) to the
  strategy's ``aggregate_train`` returned (the global ``ArrayRecord`` sealed). Flower's
  serialisation (``ArrayRecord``), the SuperNodes' push to the SuperLink and the ServerApp's
  pull from it are inside it;
- ``server_s``: from the first update bytes received on the SuperLink's port (the kernel's TCP
  counters, :class:`bench.harness.round_window.FirstBytes`) to the same end;
- ``ingest_s`` / ``aggregate_s``: the e2e window split at ``aggregate_train``'s entry (the
  strategy has every reply then);
- memory: with ``groups``, the server group's cgroup peak over the window; beside it the
  server processes' summed ``VmHWM`` (reset as the clients are released) and a sampled peak.

A point that fails (the memory guard stops it, a process errors, or it times out) is returned as
a failure record (:func:`bench.harness.round_window.failure`) with the sizes seen, not raised.

Usage: ``python -m bench.flower_baseline [--clients 20] [--mb 44.8] [--rule fedavg] [--cpus 0]
[--out DIR]`` (the server side in a cgroup pinned to ``--cpus``, the clients in another) prints a
Markdown table and writes ``bench/results/flower_baseline.{json,md}`` (or under ``--out``).
``bench.dataplane``, ``bench.scale`` and ``bench.robust`` call :func:`run_flower_round`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.flower_report import render
from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.harness.compare import REPEATS
from bench.harness.flower_env import FLOWER_VERSION, flower_python
from bench.runinfo import (
    PINNED_THREADS,
    ROOT,
    pinned_threads,
    run_info,
    stop_on_sigterm,
    write_result,
)

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups

log = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results"
APP = Path(__file__).resolve().parent / "harness" / "flower_app.py"
#: the strategies of :mod:`bench.harness.flower_app` (its run config's ``rule``)
RULES = ("fedavg", "median", "krum")

#: the Flower App's ``pyproject.toml``: its components and run config (``flwr run`` sets them)
APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedfaas-bench-flower"
version = "1.0.0"
description = "FedFaaS's benchmark peer: one round of a Flower strategy"
license = "Apache-2.0"
dependencies = ["flwr=={version}", "numpy"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedfaas"

[tool.flwr.app.components]
serverapp = "flower_app:server"
clientapp = "flower_app:client"

[tool.flwr.app.config]
work = ""
num-clients = 2
rule = "fedavg"
"""


def _toml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def _app(
    root: Path, port: int, source: Path = APP, config: Mapping[str, Any] | None = None
) -> tuple[Path, Path]:
    """The Flower App folder (``source`` as ``flower_app.py`` and its ``pyproject.toml``,
    ``config``'s keys added to its run config) and a Flower home whose configuration names
    the SuperLink at ``port`` (``bench``, insecure: loopback)."""
    app, home = root / "app", root / "flwr-home"
    app.mkdir()
    home.mkdir()
    shutil.copy(source, app / "flower_app.py")
    extra = "".join(f"{k} = {_toml(v)}\n" for k, v in (config or {}).items())
    (app / "pyproject.toml").write_text(APP_PYPROJECT.format(version=FLOWER_VERSION) + extra)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    return app, home


def process_env(python: Path, home: Path) -> dict[str, str]:
    """The environment of Flower's processes: its environment's commands first on ``PATH``,
    this repository importable, the Flower home ``home``, BLAS pools pinned, no telemetry."""
    return {
        **os.environ,
        **PINNED_THREADS,
        "PATH": f"{python.parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
    }


def wait_for(
    done: Callable[[], bool], check: Callable[[], dict[str, Any] | None], period: float = 0.02
) -> dict[str, Any] | None:
    """Poll ``done`` every ``period`` s until it holds (None), or return the failure record
    ``check`` gives first (a process died, the guard tripped, the deadline passed)."""
    while not done():
        if (bad := check()) is not None:
            return bad
        time.sleep(period)
    return None


def round_incomplete(
    marks: Mapping[str, Any], num_clients: int, base: Mapping[str, Any], failures: int = 0
) -> dict[str, Any] | None:
    """The failure record of a round whose ServerApp (its ``server.json`` marks) did not get
    a result from each of ``num_clients`` or got other than ``failures`` error replies."""
    if marks.get("results") == num_clients and len(marks.get("failures") or ()) == failures:
        return None
    return rw.failure(
        "error",
        f"round incomplete: {marks.get('results')} results, failures {marks.get('failures')}",
        **base,
    )


# --------------------------------------------------------------------------- orchestration
def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill every process started (each leads its own session) and what it started."""
    pids = rw.tree([p.pid for p in procs if p.poll() is None])
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def _supernode_bound(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> bool:
    """Whether a SuperNode bound its port (its uvicorn says "Uvicorn running on"), False when
    it exited first; raises ``TimeoutError`` past ``timeout``. A connection to the port is no
    sign: whoever took the port may be listening on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = proc.poll() is not None
        if "Uvicorn running on" in log_path.read_text(errors="replace"):
            return True
        if exited:
            return False
        time.sleep(0.1)
    raise TimeoutError(f"{log_path.name}: no bound port in {timeout:.0f} s")


def _port_taken(log_path: Path) -> bool:
    """Whether a SuperNode's log says its port was in use when it bound it."""
    return "address already in use" in log_path.read_text(errors="replace")


def run_flower_round(
    num_clients: int = 20,
    layout: Sequence[tuple[str, Sequence[int]]] | None = None,
    *,
    seed: int = 0,
    timeout: float = 600.0,
    mem_limit_bytes: int = 0,
    floor_bytes: int = rw.DEFAULT_FLOOR_BYTES,
    groups: RoundGroups | None = None,
    rule: str = "fedavg",
    weights: Sequence[Path] | None = None,
    keep_model: bool = False,
    app: Path = APP,
    app_config: Mapping[str, Any] | None = None,
    collect: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One round of Flower's strategy ``rule`` (:data:`RULES`) with a real SuperLink and
    ``num_clients`` SuperNodes.

    ``app``: the Flower App's file (default :mod:`bench.harness.flower_app`; another leaves
    the same marks, e.g. :mod:`bench.secagg_flower_app`), ``app_config`` more keys of its run
    config, ``collect`` reads more of the round's figures from its ``work`` folder before it
    is removed (merged into the record).

    ``layout``: (name, shape) of the float32 tensors every client returns; None = ResNet-18's
    floating-point state dict (:func:`bench.harness.rc.resnet18_layout`, 44.8 MB).
    ``weights``: one file per client in :func:`~bench.harness.rc.write_weights`'s
    layout (None: one file of ``seed`` that every client shares). ``mem_limit_bytes`` (0:
    none) and ``floor_bytes``: the memory guard's limit on the server side's RSS and floor on
    the machine's available memory. ``groups``: the round's cgroups; the SuperLink (and so
    its ServerApp) is born in ``groups.server``, the SuperNodes (and their ClientApps) in
    ``groups.clients``, and the record has ``cgroup`` (each group's peak memory, CPU-seconds
    and threads from the clients' release to ``aggregate_train`` returned,
    :meth:`~bench.harness.cgroups.RoundGroups.close_window`). ``keep_model``: the record's
    ``model`` is the published global model as one flat float32 vector (not JSON).

    Returns ``{"ok": True, "e2e_s", "server_s", "ingest_s", "aggregate_s", "round_s",
    "server_hwm_bytes", "server_idle_rss_bytes", "server_peak_bytes", "num_clients",
    "update_bytes", "num_tensors", "flwr_version", "api", "rule", "method", ...}`` or a failure
    record (``{"ok": False, "failure": "killed" | "error" | "timeout", "detail", ...}``).
    """
    from bench.harness.cgroups import born_in
    from core.services import ServiceError, free_port, free_ports, wait_for_port

    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
    if weights is not None and len(weights) != num_clients:
        raise ValueError(f"{len(weights)} weight files for {num_clients} clients")
    layout = [(n, list(s)) for n, s in (layout or rc.resnet18_layout())]
    size = rc.layout_bytes(layout)
    base = {
        "flwr_version": FLOWER_VERSION,
        "api": "Message API (ServerApp + ClientApp), Deployment Runtime (SuperLink, "
        "SuperNodes, flwr run)",
        "rule": rule,
        "num_clients": num_clients,
        "update_bytes": size,
        "num_tensors": len(layout),
    }
    python = flower_python()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    guard: rw.MemoryGuard | None = None
    first: rw.FirstBytes | None = None
    last: rw.FirstBytes | None = None
    peak: rw.PeakMemory | None = None
    acct: dict[str, Any] | None = None
    shared = Path(f"/dev/shm/fedfaas-bench-flower-{os.getpid()}-{time.monotonic_ns()}")
    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        app, home = _app(root, port, app, app_config)
        env = process_env(python, home)
        try:
            rc.share_weights(work, layout, seed=seed, shared=shared, weights=weights)

            def spawn(argv: list[str], logname: str, side: str | None) -> subprocess.Popen[bytes]:
                group = getattr(groups, side) if groups is not None and side else None
                with open(root / logname, "wb") as logf, born_in(group):
                    p = subprocess.Popen(
                        [str(python.parent / argv[0]), *argv[1:]],
                        cwd=root,
                        env=env,
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                procs.append(p)
                return p

            superlink = spawn(
                ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                 "--disable-runtime-dependency-installation"],
                "superlink.log",
                "server",
            )  # fmt: skip
            guard = rw.MemoryGuard(
                lambda: [superlink.pid],
                lambda: _stop(procs),
                client_pids=lambda: [p.pid for p in procs[1:]],
                limit_bytes=mem_limit_bytes,
                floor_bytes=floor_bytes,
            )
            guard.start()
            deadline = time.monotonic() + timeout
            nodes: list[subprocess.Popen[bytes]] = []

            def check() -> dict[str, Any] | None:
                """A failure record when the point cannot finish, else None."""
                return rw.point_failure(
                    guard,
                    ("superlink", superlink, root / "superlink.log"),
                    [(c, root / f"supernode-{k}.log") for k, c in enumerate(nodes)],
                    deadline,
                    f"no aggregated model in {timeout:.0f} s",
                    server_may_finish=False,
                    **base,
                )

            try:
                wait_for_port("127.0.0.1", port, 120, superlink)
            except ServiceError as exc:
                return check() or rw.failure("error", f"superlink did not listen: {exc}", **base)
            # the SuperNodes' ports drawn together, all different (one free_port() draw each
            # could answer a port drawn for a SuperNode not yet bound), and a SuperNode whose
            # port was taken before it bound it (it exits "address already in use", as two of
            # three 20-client SecAgg+ runs did) started again on another
            node_ports = free_ports(num_clients)

            def supernode(cid: int) -> subprocess.Popen[bytes]:
                return spawn(
                    ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                     "--host", "127.0.0.1", "--port", str(node_ports[cid]),
                     "--node-config", f"cid={cid}"],
                    f"supernode-{cid}.log",
                    "clients",
                )  # fmt: skip

            nodes.extend(supernode(cid) for cid in range(num_clients))
            for cid in range(num_clients):
                for _ in range(3):
                    log_path = root / f"supernode-{cid}.log"
                    try:
                        if _supernode_bound(nodes[cid], log_path, 120):
                            break
                    except TimeoutError as exc:
                        return check() or rw.failure("error", str(exc), **base)
                    if not _port_taken(log_path):
                        break  # it failed otherwise: check() says how
                    log.warning("supernode %d: port %d taken, again", cid, node_ports[cid])
                    node_ports[cid] = free_port()
                    nodes[cid] = supernode(cid)
                else:
                    return check() or rw.failure("error", f"supernode {cid}: no port", **base)
                if (bad := check()) is not None:
                    return bad
            config = f"work='{work}' num-clients={num_clients} rule='{rule}'"
            config += "".join(f" {k}={_toml(v)}" for k, v in (app_config or {}).items())
            submit = subprocess.run(
                [str(python.parent / "flwr"), "run", str(app), "bench", "--run-config", config],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if submit.returncode != 0:
                return rw.failure(
                    "error", f"flwr run exited {submit.returncode}: {submit.stdout[-1500:]}"
                    f"{submit.stderr[-1500:]}", **base,
                )  # fmt: skip
            # every ClientApp has its weights in memory and waits: release them at once
            if (bad := wait_for(lambda: len(list(work.glob("ready-*"))) >= num_clients,
                                check, 0.01)) is not None:  # fmt: skip
                return bad
            idle_rss = rw.summed_rss([superlink.pid])
            rw.reset_hwm([superlink.pid])  # the peak of the window, not of the set-up
            if groups is not None:
                groups.open_window()
            peak = rw.PeakMemory(lambda: [superlink.pid])
            peak.start()
            first = rw.FirstBytes(port)
            first.start()
            # and when (nearly) every update's bytes are in: the rest of the server window is
            # the ServerApp's wait for its next poll of the SuperLink (every 3 s in Flower
            # 1.42), its pull of the replies and aggregate_train
            # (polled every 20 ms, not 2: it runs through the whole window, on the CPUs the
            # systems share)
            last = rw.FirstBytes(port, threshold=int(0.99 * num_clients * size), period=0.02)
            last.start()
            (work / "go").touch()
            if (bad := wait_for((work / "aggregated").exists, check)) is not None:
                return bad
            # the window ends as the global model is sealed, as on the other sides
            acct = groups.close_window() if groups is not None else None
            hwm = rw.summed_hwm([superlink.pid])
            peak.stop()
            # the ServerApp ends its run
            if (bad := wait_for((work / "server.json").exists, check)) is not None:
                return bad
            marks = json.loads((work / "server.json").read_text())
            if (bad := round_incomplete(marks, num_clients, base)) is not None:
                return bad
            clients = [json.loads(p.read_text()) for p in work.glob("client-*.json")]
            model = np.load(work / "global.npy") if keep_model else None
            extra = collect(work) if collect is not None else {}
        finally:
            for watcher in (first, last):
                if watcher is not None:
                    watcher.stop()
            if peak is not None:
                peak.stop()
            if guard is not None:
                guard.stop()
            _stop(procs)
            shared.unlink(missing_ok=True)
    starts = [c["t_start_ns"] for c in clients]
    end = marks["t_aggregate_end_ns"]
    assert first is not None and guard is not None
    out = {
        "ok": True,
        **base,
        "method": (
            "window: first client's weights-in-memory mark (before serialisation) -> "
            "aggregate_train returned in the ServerApp; server window from the first update "
            "bytes received on the SuperLink's port (kernel TCP counters); memory: the server "
            "group's cgroup peak (SuperLink, SuperExec, ServerApp) over the window, beside it "
            "their summed VmHWM (reset as the window opens) and a peak sampled every 5 ms"
        ),
        "e2e_s": rw.window_s(starts, end),
        "server_s": first.server_window_s(end),
        "ingest_s": rw.window_s(starts, marks["t_aggregate_start_ns"]),
        # the SuperLink has 99 % of the updates' bytes -> aggregate_train's entry: the
        # ServerApp's poll wait and its pull (deserialisation included)
        "all_bytes_to_aggregate_s": (marks["t_aggregate_start_ns"] - last.t_ns) / 1e9
        if last is not None and last.t_ns
        else None,
        **_pull_split(marks["pulls"], last.t_ns if last is not None else 0),
        "aggregate_s": (end - marks["t_aggregate_start_ns"]) / 1e9,
        "round_s": rw.window_s([marks["t_configure_ns"]], end),
        "serialise_s_max": max(c["t_serialised_ns"] - c["t_start_ns"] for c in clients) / 1e9,
        **rw.sampled_memory(peak, hwm, idle_rss, guard),
        # BLAS/OpenMP pools as the apps measured them (threadpoolctl)
        "thread_pools": {"server": marks["thread_pools"], "client": clients[0]["thread_pools"]},
        "threads_env": dict(PINNED_THREADS),
    }
    if acct is not None:
        out["cgroup"] = acct
    if model is not None:
        out["model"] = model
    return {**out, **extra}


def _pull_split(pulls: Sequence[Sequence[int]], all_bytes_ns: int) -> dict[str, Any]:
    """The ServerApp's last pull that brought replies: its duration (``last_pull_s``) and how
    long after the SuperLink had every update's bytes it began (``poll_wait_s``: the rest of
    the grid's 3 s poll interval); None when unknown."""
    fruitful = [p for p in pulls if p[2] > 0]
    if not fruitful:
        return {"last_pull_s": None, "poll_wait_s": None, "pulls": len(pulls)}
    start, end, _ = fruitful[-1]
    wait = max(0, start - all_bytes_ns) / 1e9 if all_bytes_ns else None
    return {"last_pull_s": (end - start) / 1e9, "poll_wait_s": wait, "pulls": len(pulls)}


#: the systems of the comparison: FedFaaS, Flower today, Flower's legacy path
LEGACY = "Flower 1.32.1 legacy"
CURRENT = f"Flower {FLOWER_VERSION}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--mb", type=float, default=None, help="update size in MB (default ResNet-18)")
    ap.add_argument("--rule", choices=RULES, default="fedavg", help="Flower's strategy")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="rounds per system, interleaved")
    ap.add_argument("--seed", type=int, default=0, help="the shared weights' seed (--single)")
    ap.add_argument("--cpus", default="0-1", help="the server sides' CPUs (cpuset syntax)")
    ap.add_argument("--no-legacy", action="store_true", help="leave out Flower 1.32.1's row")
    ap.add_argument(
        "--single", action="store_true", help="one round of Flower 1.42 alone, no comparison"
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    stop_on_sigterm()  # a SIGTERM still takes the run's processes, groups and files down
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # BLAS/OpenMP at one thread in this process and every process it starts, as every
    # benchmark that compares runs them
    with pinned_threads(1) as threads:
        run = run_info("bench.flower_baseline", sys.argv[1:] if argv is None else argv)
        run["threads"] = threads
        return _run(args, run)


def _run(args: argparse.Namespace, run: dict[str, Any]) -> int:
    """``main``'s run, with its parsed ``args`` and its run record ``run``."""
    layout = rc.resnet18_layout()
    if args.mb is not None:
        layout = rc.scaled_layout(layout, int(args.mb * 1e6))
    from bench.harness.cgroups import RoundGroups

    if args.single:
        with RoundGroups(f"fedfaas-bench-{os.getpid()}-flower", args.cpus) as groups:
            one = run_flower_round(
                args.clients, layout, seed=args.seed, groups=groups, rule=args.rule
            )
        _, md = write_result({"run": run, **one}, "flower_baseline", render, args.out)
        print(md)
        return 0
    from bench.harness.compare import run_compare
    from bench.harness.fedfaas_round import bench_round_e2e
    from bench.harness.flower_legacy import run_legacy_round

    n = args.clients
    work = Path(tempfile.mkdtemp(prefix="flower-compare-"))
    runners: dict[str, Any] = {
        "FedFaaS": lambda groups, tag: bench_round_e2e(
            work, layout, n, ebpf=False, tag=tag, groups=groups
        ),
        CURRENT: lambda groups, tag: run_flower_round(n, layout, groups=groups, rule=args.rule),
    }
    if not args.no_legacy:
        runners[LEGACY] = lambda groups, tag: run_legacy_round(
            n, layout, groups=groups, rule=args.rule
        )
    res: dict[str, Any] = {
        "run": run,
        "config": {
            "model": "resnet18 (10 classes)" if args.mb is None else f"scaled to {args.mb} MB",
            "clients": n,
            "update_bytes": rc.layout_bytes(layout),
            "rule": args.rule,
            "fedfaas": "1 aggregator replica x 2 endpoints, fanout 2, max_inflight 4",
            "peers": [
                f"{CURRENT}: ServerApp/ClientApp (Message API) on a SuperLink and "
                f"{n} SuperNodes, started with flwr run",
                *([] if args.no_legacy else [f"{LEGACY}: start_server/start_client (gRPC)"]),
            ],
        },
    }

    def keep(cmp: dict[str, Any]) -> None:
        """The comparison as it stands, written: a run cut short keeps what it did."""
        write_result({**res, "compare": cmp}, "flower_baseline", render, args.out)

    try:
        res["compare"] = run_compare(
            runners, cpus_sets=[args.cpus], repeats=args.repeats, after_run=keep
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _, md = write_result(res, "flower_baseline", render, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
