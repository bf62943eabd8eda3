"""Flower's legacy path, as a second Flower row: ``start_server`` / ``start_client`` (gRPC).

Flower 1.32.1, the version the project's environment holds (the ``bench`` extra), on the API
Flower has deprecated: a ``Server`` with one fit worker per client (every client uploads at once)
started by ``start_server`` on loopback, ``num_clients`` processes running a ``NumPyClient``
with ``start_client``, one round of ``FedAvg`` (``FedMedian`` or ``Krum`` with
``num_malicious_clients=4`` for the robust rows). Kept beside the current Flower
(:mod:`bench.flower_baseline`, 1.42 on the Message API and the Deployment Runtime) because the
two move the updates differently (one gRPC message per update here; one HTTP request per
array, pushed to the SuperLink and pulled by the ServerApp every 3 s, there), so they are two
different peers. Measured the same way (:mod:`bench.harness.round_window`): ``e2e_s`` from the
first client's weights-in-memory mark to ``aggregate_fit`` returned, ``server_s`` from the
first update bytes received on the server's port, the cgroups' peak and CPU-seconds.

Its processes: ``python -m bench.harness.flower_legacy --role server|client`` in this
environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.runinfo import PINNED_THREADS, ROOT, thread_counts

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups

RULES = ("fedavg", "median", "krum")


# --------------------------------------------------------------------------- roles (subprocesses)
def _server_main(port: int, num_clients: int, work: Path, rule: str) -> None:
    import flwr as fl
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg, FedMedian, Krum

    marks: dict[str, Any] = {}

    base, extra = {
        "fedavg": (FedAvg, {}),
        "median": (FedMedian, {}),
        "krum": (Krum, {"num_malicious_clients": 4}),
    }[rule]

    class TimedFedAvg(base):  # type: ignore[misc, valid-type]
        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            res = super().configure_fit(server_round, parameters, client_manager)
            marks["rss_before_round"] = rw.status_bytes(os.getpid(), "VmRSS")
            marks["t_configure_ns"] = time.monotonic_ns()
            return res

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            marks["t_aggregate_start_ns"] = time.monotonic_ns()
            marks["results"], marks["failures"] = len(results), len(failures)
            marks["failure_detail"] = [repr(f)[:300] for f in failures[:3]]
            res = super().aggregate_fit(server_round, results, failures)
            marks["t_aggregate_end_ns"] = time.monotonic_ns()
            (work / "aggregated").touch()  # the harness closes its cgroup window now
            if res[0] is not None:  # the published model, for the same-model check
                flat = np.concatenate([a.ravel() for a in parameters_to_ndarrays(res[0])])
                np.save(work / "global.npy", flat)
            return res

    # The model sent to the clients before the round carries no tensors: the clients ignore it
    # (they return their own weights), and FedFaaS's clients in the same benchmark do not
    # download one either, so neither side's clients hold a received model (the broadcast is
    # outside the window on both sides)
    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=num_clients,
        min_evaluate_clients=0,
        min_available_clients=num_clients,
        initial_parameters=ndarrays_to_parameters([]),
        accept_failures=False,
        **extra,
    )
    # Flower's default fit pool has min(32, cores + 4) threads; give every client one so that
    # all of them upload concurrently, as in the FedFaaS measurement.
    server = fl.server.Server(client_manager=fl.server.SimpleClientManager(), strategy=strategy)
    server.set_max_workers(num_clients)
    fl.server.start_server(
        server_address=f"127.0.0.1:{port}",
        server=server,
        config=fl.server.ServerConfig(num_rounds=1),
    )
    marks["server_hwm_bytes"] = rw.status_bytes(os.getpid(), "VmHWM")
    marks["thread_pools"] = thread_counts()
    (work / "server.json").write_text(json.dumps(marks))


def _client_main(server: str, cid: int, work: Path) -> None:
    import flwr as fl

    layout, weights = rc.client_weights(work, cid)
    update = [weights[n].view(np.ndarray) for n, _ in layout]
    n_samples = 100 + cid
    marks: dict[str, Any] = {"cid": cid}

    class FixedClient(fl.client.NumPyClient):
        def get_parameters(self, config: Any) -> list[np.ndarray]:
            return update

        def fit(self, parameters: Any, config: Any) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            rc.wait_go(work, cid)
            marks["t_start_ns"] = time.monotonic_ns()  # weights in memory; nothing serialised
            return update, n_samples, {}

    fl.client.start_client(server_address=server, client=FixedClient().to_client(), insecure=True)
    marks["client_hwm_bytes"] = rw.status_bytes(os.getpid(), "VmHWM")
    marks["thread_pools"] = thread_counts()
    (work / f"client-{cid}.json").write_text(json.dumps(marks))


# --------------------------------------------------------------------------- orchestration
def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def run_legacy_round(
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
) -> dict[str, Any]:
    """One round of the legacy Flower server's strategy ``rule`` (:data:`RULES`) with
    ``num_clients`` client processes.

    ``layout``: (name, shape) of the float32 tensors every client returns; None = ResNet-18's
    floating-point state dict (:func:`bench.harness.rc.resnet18_layout`, 44.8 MB).
    ``weights``: one file per client (None: one file of ``seed`` all share); ``keep_model``:
    the record's ``model`` is the aggregated model as one flat float32 vector (not JSON).
    ``mem_limit_bytes`` (0: none) and ``floor_bytes``: the memory guard's limit on the server's
    RSS and floor on the machine's available memory. ``groups``: the round's cgroups; the
    server is born in ``groups.server``, the clients in ``groups.clients``, and the record has
    ``cgroup`` (each group's peak memory, CPU-seconds and threads from the clients' release
    to ``aggregate_fit`` returned, :meth:`~bench.harness.cgroups.RoundGroups.close_window`).

    Returns ``{"ok": True, "e2e_s", "server_s", "ingest_s", "aggregate_s", "round_s",
    "server_hwm_bytes", "server_idle_rss_bytes", "client_hwm_bytes", "server_rss_sampled_bytes",
    "num_clients", "update_bytes", "num_tensors", "flwr_version", "method"}`` or a failure record
    (``{"ok": False, "failure": "killed" | "error" | "timeout", "detail", ...}``).
    """
    import flwr

    from bench.harness.cgroups import born_in
    from core.services import ServiceError, free_port, wait_for_port

    layout = [(n, list(s)) for n, s in (layout or rc.resnet18_layout())]
    size = rc.layout_bytes(layout)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
    base = {
        "flwr_version": flwr.__version__,
        "api": "start_server/start_client (deprecated), gRPC",
        "rule": rule,
        "num_clients": num_clients,
        "update_bytes": size,
        "num_tensors": len(layout),
    }
    port = free_port()
    env = {
        **os.environ,
        **PINNED_THREADS,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "GRPC_VERBOSITY": "ERROR",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    me = [sys.executable, "-m", "bench.harness.flower_legacy"]
    procs: list[subprocess.Popen[bytes]] = []
    guard: rw.MemoryGuard | None = None
    first: rw.FirstBytes | None = None
    peak: rw.PeakMemory | None = None
    shared = Path(f"/dev/shm/fedfaas-bench-flower-{os.getpid()}-{time.monotonic_ns()}")
    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        work = Path(tmp)
        try:
            rc.share_weights(work, layout, seed=seed, shared=shared, weights=weights)

            def spawn(args: list[str], logname: str, side: str) -> subprocess.Popen[bytes]:
                group = getattr(groups, side) if groups is not None else None
                with open(work / logname, "wb") as logf, born_in(group):
                    p = subprocess.Popen(
                        [*me, *args, "--port", str(port), "--work", str(work)],
                        cwd=ROOT,
                        env=env,
                        stdout=logf,
                        stderr=subprocess.STDOUT,
                    )
                procs.append(p)
                return p

            server = spawn(
                ["--role", "server", "--clients", str(num_clients), "--rule", rule],
                "server.log",
                "server",
            )
            guard = rw.MemoryGuard(
                lambda: [server.pid],
                lambda: _stop(procs),
                client_pids=lambda: [p.pid for p in procs[1:]],
                limit_bytes=mem_limit_bytes,
                floor_bytes=floor_bytes,
            )
            guard.start()
            deadline = time.monotonic() + timeout
            idle_rss = 0

            def check() -> dict[str, Any] | None:
                """A failure record when the point cannot finish, else None."""
                return rw.point_failure(
                    guard,
                    ("server", server, work / "server.log"),
                    [(c, work / f"client-{k}.log") for k, c in enumerate(procs[1:])],
                    deadline,
                    f"no aggregated model in {timeout:.0f} s",
                    server_may_finish=True,  # Flower's server ends once its rounds are done
                    **base,
                )

            try:
                wait_for_port("127.0.0.1", port, 120, server)
            except ServiceError as exc:
                return check() or rw.failure("error", f"server did not listen: {exc}", **base)
            for cid in range(num_clients):
                spawn(["--role", "client", "--cid", str(cid)], f"client-{cid}.log", "clients")
            # every client has the model and waits: release them at once
            while len(list(work.glob("ready-*"))) < num_clients:
                if (bad := check()) is not None:
                    return bad
                time.sleep(0.01)
            idle_rss = rw.summed_rss([server.pid])
            rw.reset_hwm([server.pid])  # the peak of the window, not of the model's broadcast
            if groups is not None:
                groups.open_window()
            peak = rw.PeakMemory(lambda: [server.pid])
            peak.start()
            first = rw.FirstBytes(port)
            first.start()
            (work / "go").touch()
            while server.poll() is None and not (work / "aggregated").exists():
                if (bad := check()) is not None:
                    return bad
                time.sleep(0.02)
            # the window ends as the global model is available, as on the other sides (not
            # at the server's exit, after it has said goodbye to its clients)
            acct = groups.close_window() if groups is not None else None
            while server.poll() is None:
                if (bad := check()) is not None:
                    return bad
                time.sleep(0.05)
            if (bad := check()) is not None:
                return bad
            for p in procs[1:]:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(60)
            marks = json.loads((work / "server.json").read_text())
            if marks.get("results") != num_clients or marks.get("failures"):
                return rw.failure(
                    "error",
                    f"round incomplete: {marks.get('results')} results, failures "
                    f"{marks.get('failure_detail')}",
                    **base,
                )
            clients = [json.loads(p.read_text()) for p in work.glob("client-*.json")]
            model = np.load(work / "global.npy") if keep_model else None
        finally:
            if first is not None:
                first.stop()
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
            "aggregate_fit returned; server window from the server's first update bytes read "
            "(kernel TCP counters of its port); memory: peak over the window of the server "
            "process's pages, sampled every 5 ms (beside it its VmHWM, reset as the window "
            "opens, read at the end)"
        ),
        "e2e_s": rw.window_s(starts, end),
        "server_s": first.server_window_s(end),
        "ingest_s": rw.window_s(starts, marks["t_aggregate_start_ns"]),
        "aggregate_s": (end - marks["t_aggregate_start_ns"]) / 1e9,
        "round_s": rw.window_s([marks["t_configure_ns"]], end),
        "server_peak_bytes": peak.peak_bytes if peak is not None else 0,
        "server_peak_samples": peak.samples if peak is not None else 0,
        "server_peak_sample_hz": peak.rate_hz if peak is not None else None,
        "server_hwm_bytes": int(marks["server_hwm_bytes"]),
        "server_idle_rss_bytes": idle_rss,
        "server_rss_before_round_bytes": int(marks["rss_before_round"]),
        "server_rss_sampled_bytes": guard.peak_server_rss,
        "client_hwm_bytes": sum(int(c["client_hwm_bytes"]) for c in clients),
        "server_processes": 1,
        # BLAS/OpenMP pools as the processes measured them at the end (threadpoolctl)
        "thread_pools": {"server": marks["thread_pools"], "client": clients[0]["thread_pools"]},
    }
    if acct is not None:
        out["cgroup"] = acct
    if model is not None:
        out["model"] = model
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--role", choices=["server", "client"], required=True)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rule", choices=RULES, default="fedavg")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cid", type=int, default=0)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.role == "server":
        _server_main(args.port, args.clients, args.work, args.rule)
    else:
        _client_main(f"127.0.0.1:{args.port}", args.cid, args.work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
