"""Flower baseline: one FedAvg round of a real Flower server and N real clients on loopback.

The peer FedFaaS's data plane is measured against (DESIGN.md, "What fast means here").
A Flower server (legacy ``start_server``, gRPC on loopback) and ``num_clients`` client
processes (``start_client``) run one round of ``FedAvg``; every client returns a fixed random
update of ``num_params`` float32 values (shaped like ResNet-18's tensors by default), so the
server deserialises and aggregates real ResNet-18-sized payloads.

Figures (all from one run, same machine):

- ``first_byte_to_model_s``: from the first client finishing ``fit`` (its update starts to
  travel) to the end of the server's ``aggregate_fit`` (aggregated model ready). Clients hold
  their ``fit`` answer until all of them have received the model (a file barrier), so this
  window holds the 20 concurrent uploads and the aggregation only, as in FedFaaS's round
  measurement, not Flower's broadcast of the model;
- ``ingest_s`` / ``aggregate_s``: the same window split at the moment the server has every
  result (Flower aggregates only then);
- ``round_s``: from the server sending the model to the clients to the aggregated model
  (broadcast, barrier, uploads and aggregation);
- ``server_peak_rss_bytes``: the server process's peak resident set (``VmHWM``), with the
  parent's psutil sampling as a cross-check.

Usage: ``python -m bench.flower_baseline [--clients 20] [--params N]`` prints a Markdown table
and writes ``bench/results/flower_baseline.json``. The data-plane bench calls
:func:`run_flower_round`. Pinned: ``flwr==1.32.1`` (1.33+ pins fastapi<0.139).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results"
RESNET18_10_CLASSES = 11_181_642  # parameters of torchvision resnet18(num_classes=10)


# --------------------------------------------------------------------------- payload shapes
def resnet18_shapes(num_classes: int = 10) -> list[list[int]]:
    """Shapes of torchvision ResNet-18's parameters (62 tensors, 11,181,642 values)."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    return [list(p.shape) for p in model.parameters()]


def shapes_for(num_params: int | None) -> list[list[int]]:
    """ResNet-18 shapes when ``num_params`` is None, else one flat tensor of that size."""
    if num_params is None:
        return resnet18_shapes()
    return [[int(num_params)]]


def _arrays(shapes: list[list[int]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(int(np.prod(s)), dtype=np.float32).reshape(s) for s in shapes]


def _peak_rss_self() -> int:
    """This process's peak resident set in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_self() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------- roles (subprocesses)
def _server_main(port: int, num_clients: int, shapes: list[list[int]], out: Path) -> None:
    import flwr as fl
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAvg

    marks: dict[str, float] = {}

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            res = super().configure_fit(server_round, parameters, client_manager)
            marks["rss_before_round"] = float(_rss_self())
            marks["t_configure"] = time.time()
            return res

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            marks["t_aggregate_start"] = time.time()
            res = super().aggregate_fit(server_round, results, failures)
            marks["t_aggregate_end"] = time.time()
            marks["results"] = float(len(results))
            marks["failures"] = float(len(failures))
            return res

    zeros = [np.zeros(s, dtype=np.float32) for s in shapes]
    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=num_clients,
        min_evaluate_clients=0,
        min_available_clients=num_clients,
        initial_parameters=ndarrays_to_parameters(zeros),
        accept_failures=False,
    )
    del zeros
    # Flower's default fit pool has min(32, cores + 4) threads (6 here); give every client one
    # so that all of them upload concurrently, as in the FedFaaS measurement.
    server = fl.server.Server(client_manager=fl.server.SimpleClientManager(), strategy=strategy)
    server.set_max_workers(num_clients)
    fl.server.start_server(
        server_address=f"127.0.0.1:{port}",
        server=server,
        config=fl.server.ServerConfig(num_rounds=1),
    )
    marks["server_peak_rss_bytes"] = float(_peak_rss_self())
    out.write_text(json.dumps(marks))


def _barrier(out: Path, cid: int, num_clients: int, timeout: float = 120.0) -> None:
    """Wait until every client has received the model (one marker file per client)."""
    (out / f"ready-{cid}").touch()
    deadline = time.monotonic() + timeout
    while len(list(out.glob("ready-*"))) < num_clients:
        if time.monotonic() > deadline:
            raise RuntimeError(f"client {cid}: barrier not reached in {timeout}s")
        time.sleep(0.005)


def _client_main(
    server: str, cid: int, num_clients: int, shapes: list[list[int]], seed: int, out: Path
) -> None:
    import flwr as fl

    update = _arrays(shapes, seed + 1 + cid)
    n = 100 + cid

    class FixedClient(fl.client.NumPyClient):
        def get_parameters(self, config: Any) -> list[np.ndarray]:
            return update

        def fit(self, parameters: Any, config: Any) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            _barrier(out, cid, num_clients)
            t = time.time()
            (out / f"client-{cid}.json").write_text(json.dumps({"cid": cid, "t_fit_return": t}))
            return update, n, {}

    fl.client.start_client(server_address=server, client=FixedClient().to_client(), insecure=True)


# --------------------------------------------------------------------------- orchestration
class _RssSampler(threading.Thread):
    def __init__(self, pid: int, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process(pid)
        self.period = period
        self.peak = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except Exception:  # noqa: BLE001 - process gone
                return
            time.sleep(self.period)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(2)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def run_flower_round(
    num_clients: int = 20,
    num_params: int | None = None,
    *,
    seed: int = 0,
    timeout: float = 300.0,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Run one FedAvg round with a real Flower server and ``num_clients`` client processes.

    Parameters
    ----------
    num_clients : clients (one process each), all required for the round.
    num_params : float32 values per update; None = ResNet-18 (10 classes) parameter shapes,
        62 tensors, 11,181,642 values (44.7 MB).
    seed : the updates are random but fixed by this seed.
    timeout : seconds before everything is stopped and ``RuntimeError`` is raised.

    Returns
    -------
    dict with ``first_byte_to_model_s``, ``ingest_s``, ``aggregate_s``, ``round_s``,
    ``server_peak_rss_bytes``, ``server_peak_rss_sampled_bytes``, ``server_rss_before_round_bytes``,
    ``num_clients``, ``num_params``, ``update_bytes``, ``flwr_version``.
    """
    import flwr

    from fedfaas.services import free_port, wait_for_port

    shapes = shapes_for(num_params)
    total = int(sum(int(np.prod(s)) for s in shapes))
    tmp_ctx = tempfile.TemporaryDirectory(prefix="flower-bench-") if workdir is None else None
    work = Path(tmp_ctx.name) if tmp_ctx is not None else workdir
    assert work is not None
    work.mkdir(parents=True, exist_ok=True)
    (work / "shapes.json").write_text(json.dumps(shapes))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "GRPC_VERBOSITY": "ERROR",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    me = [sys.executable, "-m", "bench.flower_baseline"]
    root = str(Path(__file__).resolve().parent.parent)
    procs: list[subprocess.Popen[bytes]] = []
    server_out = work / "server.json"
    try:
        logf = open(work / "server.log", "wb")  # noqa: SIM115 - handed to the child
        server = subprocess.Popen(
            [
                *me,
                "--role",
                "server",
                "--port",
                str(port),
                "--clients",
                str(num_clients),
                "--work",
                str(work),
            ],
            cwd=root,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        procs.append(server)
        sampler = _RssSampler(server.pid)
        sampler.start()
        wait_for_port("127.0.0.1", port, 60, server)
        for cid in range(num_clients):
            clog = open(work / f"client-{cid}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [
                        *me,
                        "--role",
                        "client",
                        "--port",
                        str(port),
                        "--cid",
                        str(cid),
                        "--clients",
                        str(num_clients),
                        "--seed",
                        str(seed),
                        "--work",
                        str(work),
                    ],
                    cwd=root,
                    env=env,
                    stdout=clog,
                    stderr=subprocess.STDOUT,
                )
            )
            clog.close()
        logf.close()
        deadline = time.monotonic() + timeout
        while server.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"flower round did not finish in {timeout}s (see {work})")
            time.sleep(0.1)
        sampler.stop()
        if server.returncode != 0 or not server_out.exists():
            tail = (work / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"flower server failed ({server.returncode}): {tail}")
        marks = json.loads(server_out.read_text())
        sends = [json.loads(p.read_text())["t_fit_return"] for p in work.glob("client-*.json")]
    finally:
        _stop(procs)
        if tmp_ctx is not None:
            tmp_ctx.cleanup()
    if int(marks.get("results", 0)) != num_clients or int(marks.get("failures", 0)) != 0:
        raise RuntimeError(f"flower round incomplete: {marks}")
    first = min(sends)
    return {
        "flwr_version": flwr.__version__,
        "num_clients": num_clients,
        "num_params": total,
        "num_tensors": len(shapes),
        "update_bytes": total * 4,
        "first_byte_to_model_s": marks["t_aggregate_end"] - first,
        "ingest_s": marks["t_aggregate_start"] - first,
        "aggregate_s": marks["t_aggregate_end"] - marks["t_aggregate_start"],
        "round_s": marks["t_aggregate_end"] - marks["t_configure"],
        "server_peak_rss_bytes": int(marks["server_peak_rss_bytes"]),
        "server_peak_rss_sampled_bytes": int(sampler.peak),
        "server_rss_before_round_bytes": int(marks["rss_before_round"]),
    }


def _machine() -> dict[str, Any]:
    import psutil

    return {
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
    }


def _table(res: dict[str, Any]) -> str:
    mb = 1e6
    rows = [
        (
            "clients x update",
            f"{res['num_clients']} x {res['update_bytes'] / mb:.1f} MB "
            f"({res['num_params']:,} float32, {res['num_tensors']} tensors)",
        ),
        ("first byte -> aggregated model", f"{res['first_byte_to_model_s']:.2f} s"),
        ("  of which ingest (all results in)", f"{res['ingest_s']:.2f} s"),
        ("  of which aggregate_fit", f"{res['aggregate_s']:.2f} s"),
        ("round (model sent -> aggregated)", f"{res['round_s']:.2f} s"),
        ("server peak RSS (VmHWM)", f"{res['server_peak_rss_bytes'] / mb:.0f} MB"),
        ("server RSS before round", f"{res['server_rss_before_round_bytes'] / mb:.0f} MB"),
    ]
    lines = ["| Flower " + res["flwr_version"] + " | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["bench", "server", "client"], default="bench")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--params", type=int, default=None)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cid", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.role == "server":
        shapes = json.loads((args.work / "shapes.json").read_text())
        _server_main(args.port, args.clients, shapes, args.work / "server.json")
        return 0
    if args.role == "client":
        shapes = json.loads((args.work / "shapes.json").read_text())
        _client_main(f"127.0.0.1:{args.port}", args.cid, args.clients, shapes, args.seed, args.work)
        return 0
    res = run_flower_round(args.clients, args.params, seed=args.seed)
    res["machine"] = _machine()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "flower_baseline.json").write_text(json.dumps(res, indent=2) + "\n")
    print(_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
