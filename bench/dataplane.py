"""Data-plane benchmark: HTTP ingest into shared memory, FedAvg fold speed, one full round.

Figures, all from one run on this machine (baselines in the same process tree):

- the same-CPUs comparison (``compare``, :mod:`bench.harness.compare`), first: the round of
  every system (FedFaaS, :mod:`bench.harness.fedfaas_round`; Flower; SF) ``--repeats`` times
  (default 5) for each CPU set of ``--cpus`` (default ``0``, then every CPU), the systems
  alternating run by run, each run in fresh cgroups (:mod:`bench.harness.cgroups`): the server
  side (FedFaaS: gateway, aggregator replicas, Redis; Flower: its server; SF: its leaf servers
  and top) born in a group pinned to the CPU set, the clients in another. Per system: median
  and min-max of both windows, each group's peak memory (``memory.max_usage_in_bytes``, reset
  as the window opens: every page charged once, shared memory included), the server group's
  CPU-seconds in the round (``cpuacct.usage``) and the threads it ran; the sampled per-process
  peak as a secondary column with its sample rate; FedFaaS's design floor beside its peak;
  FedFaaS's ratios to each baseline as ratios of medians. File pages already in the page cache
  when a run starts (shared libraries an earlier run read) stay charged to the group that read
  them first, so a group's peak is its anonymous and shared memory plus the file pages it read
  first;
- ingest: one 44.8 MB ResNet-18 update over loopback into the store, client in its own process,
  timed from the first byte sent to the response: the FedFaaS gateway (``python -m gateway``)
  against raw loopback TCP into an mmap'd /dev/shm buffer and a plain uvicorn+Starlette
  streaming upload into a buffer;
- aggregation, one core: update bytes folded per second by ``core.fedavg`` (numpy blocked
  axpy and torch ``add_``) over read-only shared-memory views, against a fused ``add_`` on
  plain tensors and Flower's ``aggregate`` (the real ``flwr`` function);
- round, measured as Flower's is (:mod:`bench.harness.round_window`, the same helpers on both
  sides): 20 clients, one process each on this machine, hold ResNet-18's floating-point state
  dict (44.8 MB float32) as numpy arrays and are released at once; each serialises it to
  safetensors and uploads it through :meth:`client.sdk.FLClient.upload` to one node gateway
  whose round warm replicas of the ``aggregator`` function aggregate (started as the runtime
  starts them, ``bench.stack``; they register job-agnostic and the gateway grants them the
  job). Figures: weights in client memory -> global model published (``e2e_s``); the
  server-side window only, first update bytes received on the gateway's port -> global
  published (``server_s``); the round's tail, last update sealed -> global published
  (``last_update_to_published_s``); the server's peak memory with every page counted once:
  every single run too has its server side and clients in cgroups of their own (on every CPU),
  and the peak is the server cgroup's, beside the sampled per-process peak
  (:class:`~bench.harness.round_window.PeakMemory`, with its sample rate) and the sum of their
  ``VmHWM`` (reset as the window opens, read at the end; it counts the store's arena once per
  process that maps it). The round runs with the eBPF router when ``bpf.probe()`` says it
  loads here (``round``, ``round_lean``, ``round_one_core``: the top and the publication on one
  thread, against the default's on the node's cores) and, as its peer in the same run, with the
  userspace router (``round_userspace``); each round records the router mode it got. The memory
  sweep (``memory_sweep``) runs the default round at 20, 60, 120 and 200 clients. Two
  baselines, the same clients measured the same way in the same run:
  a real Flower server (``bench.flower_baseline``: its clients serialise inside the window too)
  and the SF round (``round_sf``, :mod:`bench.harness.sf_round`: LIFL's serverful baseline,
  long-running leaf and top aggregator processes passing whole objects over HTTP: clients POST
  safetensors to their leaf, leaves fold with FedFaaS's kernel and POST their raw partial to
  the top, which divides, encodes and serves the global model; ``ceil(clients / I)`` leaves on
  ``--sf-leaf-servers`` processes). Every FedFaaS round row gives both baselines' figures and
  FedFaaS's ratio against each.

Every process runs with BLAS/OpenMP pinned to one thread (``bench.runinfo.pinned_threads``);
each table row says so. The Markdown is rendered from the JSON as written
(``bench.runinfo.write_result``).

Usage: ``python -m bench.dataplane [--clients 20] [--repeats 5] [--cpus 0 --cpus 0-1]
[--compare-only] [--skip-flower] [--quick] [--out DIR]``; writes
``bench/results/dataplane.{json,md,png}`` (or under ``--out``; no plot with
``--compare-only``) and prints the table. ``--quick`` is a smoke run (4 clients, a 4 MB model,
a sweep of 4 and 8 clients).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import dataplane_report as report
from bench.harness.compare import REPEATS
from bench.harness.fedfaas_round import bench_round_e2e
from bench.runinfo import (
    pinned_threads,
    rerender,
    run_info,
    write_result,
)

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups

from bench.dataplane_ingest import bench_aggregation, bench_ingest, write_bodies

RESULTS = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------- settings
#: clients per round of the memory sweep (ResNet-18, the default round's settings)
SWEEP = (20, 60, 120, 200)
QUICK_SWEEP = (4, 8)
#: the one-core variant: the top folds and the gateway encodes on one thread each
ONE_CORE: dict[str, Any] = {
    "gateway": {"encode_threads": 1},
    "aggregator_env": {"FEDFAAS_AGGREGATOR_TOP_THREADS": "1"},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dataplane")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--fanout", type=int, default=2)
    p.add_argument("--max-inflight", type=int, default=4)
    p.add_argument("--replicas", type=int, default=1, help="aggregator replicas per round")
    p.add_argument("--endpoints", type=int, default=2, help="endpoints per aggregator replica")
    p.add_argument(
        "--sf-leaf-servers", type=int, default=2, help="SF round: leaf aggregator processes"
    )
    p.add_argument("--skip-flower", action="store_true")
    p.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help="the same-CPUs comparison: runs of each system per CPU set, interleaved",
    )
    p.add_argument(
        "--cpus",
        action="append",
        help="a CPU set (cpuset syntax, e.g. 0 or 0-1) for every system's server side in the "
        "comparison; repeat for more rows (default: 0, then every CPU this process may use)",
    )
    p.add_argument(
        "--compare-only",
        action="store_true",
        help="run only the same-CPUs comparison (no ingest, fold, round variants or sweep)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 4 clients, rounds of a 4 MB model, 2 ingest reps, 3 fold updates",
    )
    p.add_argument("--out", help="results folder (default bench/results)")
    p.add_argument(
        "--from-json", action="store_true", help="re-render the table and plot from dataplane.json"
    )
    a = p.parse_args(argv)
    out_dir = Path(a.out) if a.out else RESULTS
    if a.from_json:
        print(rerender("dataplane", report.render, report.plot, out_dir))
        return 0
    import bpf
    from bench.harness import round_clients as rc
    from bench.harness.cgroups import parse_cpus
    from bench.harness.compare import Runner, run_compare
    from bench.harness.sf_round import run_sf_round
    from core.services import RedisServer

    run = run_info("bench.dataplane", sys.argv[1:] if argv is None else argv)
    mode, reason = bpf.probe()
    ebpf = mode == "ebpf"
    clients = 4 if a.quick else a.clients
    layout = rc.resnet18_layout()
    if a.quick:
        layout = rc.scaled_layout(layout, 4_000_000)
    # each set once (on a one-CPU machine the default's two are the same)
    cpus_sets = list(dict.fromkeys(a.cpus or ["0", _cpu_list(sorted(os.sched_getaffinity(0)))]))
    for cpus in cpus_sets:
        parse_cpus(cpus)  # a bad set fails now, not after an hour of rounds
    with (
        pinned_threads(1) as threads,
        tempfile.TemporaryDirectory(prefix="fedfaas-bench-dp-") as tmp,
    ):
        work = Path(tmp)
        res: dict[str, Any] = {
            "run": run,
            "threads": {"env": threads["env"], "pools": threads["pools"]},
            "machine": {
                k: run["machine"][k] for k in ("cores", "memory_bytes", "python", "kernel")
            },
            "router_probe": {"mode": mode, "reason": reason},
            "config": {
                "model": "resnet18 (10 classes)"
                + (", scaled to 4 MB (--quick)" if a.quick else ""),
                "clients": clients,
                "ingest_reps": 2 if a.quick else a.reps,
                "aggregator_replicas": a.replicas,
                "endpoints_per_replica": a.endpoints,
                "sf_leaf_servers": a.sf_leaf_servers,
            },
        }
        agg = {"replicas": a.replicas, "endpoints": a.endpoints}
        rnd = {"fanout": a.fanout, "max_inflight": a.max_inflight, **agg}
        runners: dict[str, Runner] = {
            "FedFaaS": lambda groups, tag: bench_round_e2e(
                work, layout, clients, ebpf=ebpf, tag=tag, groups=groups, **rnd
            ),
        }
        if not a.skip_flower:
            from bench.flower_baseline import run_flower_round

            runners["Flower"] = lambda groups, tag: run_flower_round(clients, layout, groups=groups)
        runners["SF"] = lambda groups, tag: run_sf_round(
            work,
            layout,
            clients,
            fanout=a.fanout,
            leaf_servers=a.sf_leaf_servers,
            groups=groups,
            tag=tag,
        )
        res["compare"] = run_compare(
            runners,
            cpus_sets=cpus_sets,
            repeats=a.repeats,
            # written after every run: a run cut short keeps what it did
            after_run=lambda cmp: _write({**res, "compare": cmp}, out_dir, quiet=True),
        )
        if a.compare_only:
            _write(res, out_dir)
            return 0
        redis = RedisServer(data_dir=work / "redis").start()
        try:
            body = write_bodies(work, 1)[0]
            res["ingest"] = bench_ingest(work, redis, body, res["config"]["ingest_reps"], ebpf=ebpf)
        finally:
            redis.stop()
        res["aggregation"] = bench_aggregation(3 if a.quick else 8)

        # the single runs below: each in cgroups of its own too, on every CPU
        def fed(n: int, tag: str, router_ebpf: bool, **kw: Any) -> OneRun:
            return lambda g: bench_round_e2e(
                work, layout, n, ebpf=router_ebpf, tag=tag, groups=g, **kw
            )

        res["round"] = _grouped("round", fed(clients, "d", ebpf, **rnd))
        # the same round with the userspace router: the peer of the eBPF run (when the probe
        # says eBPF cannot load, ``round`` is already this; it is not run twice)
        res["round_userspace"] = (
            _grouped("round_userspace", fed(clients, "d", False, **rnd)) if ebpf else None
        )
        lean = {"fanout": 4, "max_inflight": 1, **agg}
        res["round_lean"] = _grouped("round_lean", fed(clients, "l", ebpf, **lean))
        res["round_one_core"] = _grouped(
            "round_one_core", fed(clients, "o", ebpf, **rnd, **ONE_CORE)
        )
        res["memory_sweep"] = {
            str(n): res["round"]
            if n == clients
            else _grouped(f"sweep{n}", fed(n, "s", ebpf, **rnd))
            for n in (QUICK_SWEEP if a.quick else SWEEP)
        }
        res["round_sf"] = _grouped(
            "round_sf",
            lambda g: run_sf_round(
                work, layout, clients, fanout=a.fanout, leaf_servers=a.sf_leaf_servers, groups=g
            ),
        )
        if not a.skip_flower:
            from bench.flower_baseline import run_flower_round

            res["flower"] = _grouped(
                "flower", lambda g: run_flower_round(clients, layout, groups=g)
            )
    _write(res, out_dir)
    return 0


#: one single run's round, given its cgroups
OneRun = Callable[["RoundGroups"], dict[str, Any]]


def _grouped(name: str, run: OneRun) -> dict[str, Any]:
    """One single-run round (``name``) with its server side and clients in cgroups of their
    own (on every CPU), removed after it."""
    from bench.harness.cgroups import RoundGroups

    with RoundGroups(f"fedfaas-bench-{os.getpid()}-{name}") as groups:
        return dict(run(groups))


def _cpu_list(cpus: list[int]) -> str:
    """``[0, 1, 3]`` -> ``"0,1,3"`` (cpuset syntax)."""
    return ",".join(str(c) for c in cpus)


def _write(res: dict[str, Any], out_dir: Path, *, quiet: bool = False) -> None:
    stored, md = write_result(res, "dataplane", report.render, out_dir)
    report.plot(stored, out_dir / "dataplane.png")
    if not quiet:
        print(md)


if __name__ == "__main__":
    raise SystemExit(main())
