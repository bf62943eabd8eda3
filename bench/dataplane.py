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
- the round's variants (``variants``), FedFaaS alone, compared as the systems are (the same
  :func:`~bench.harness.compare.run_compare`, ``--repeats`` runs each, alternating, on every
  CPU): the default round (the eBPF router when ``bpf.probe()`` says it loads), the same with
  the userspace router (its peer; left out when eBPF cannot load), the lean settings (I=4, one
  upload at once) and the top and the publication on one thread each (``one core``); besides
  the compared figures, each run's tail (last update sealed -> global published) and ACT over
  pure ingest. The memory sweep over clients per round is ``bench.scale``'s clients axis
  (20 to 200, FedFaaS against Flower and SF, repeated).

Every round is measured as Flower's is (:mod:`bench.harness.round_window`, the same helpers on
every side): the clients, one process each on this machine, hold ResNet-18's floating-point
state dict (44.8 MB float32) as numpy arrays and are released at once; FedFaaS's give it to
:meth:`client.sdk.FLClient.upload`, which writes it as safetensors while it sends it to one
node gateway whose warm ``aggregator`` replicas aggregate (started as the runtime starts them,
``bench.stack``; they register job-agnostic and the gateway grants them the job). Flower is
``bench.flower_baseline`` (its clients serialise inside the window too); SF is
:mod:`bench.harness.sf_round` (LIFL's serverful baseline: long-running leaf and top
aggregator processes passing whole objects over HTTP; ``ceil(clients / I)`` leaves on
``--sf-leaf-servers`` processes).

Every process runs with BLAS/OpenMP pinned to one thread (``bench.runinfo.pinned_threads``);
each table row says so. The Markdown is rendered from the JSON as written
(``bench.runinfo.write_result``).

Usage: ``python -m bench.dataplane [--clients 20] [--repeats 5] [--cpus 0 --cpus 0-1]
[--compare-only] [--skip-flower] [--quick] [--out DIR]``; writes
``bench/results/dataplane.{json,md,png}`` (or under ``--out``; no plot with
``--compare-only``) and prints the table. ``--quick`` is a smoke run (4 clients, a 4 MB model).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import dataplane_report as report
from bench.dataplane_ingest import bench_aggregation, bench_ingest, write_bodies
from bench.harness.compare import REPEATS, Runner
from bench.harness.fedfaas_round import bench_round_e2e
from bench.runinfo import (
    pinned_threads,
    rerender,
    run_info,
    stop_on_sigterm,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------- settings
#: the one-core variant: the top folds and the gateway encodes on one thread each
ONE_CORE: dict[str, Any] = {
    "gateway": {"encode_threads": 1},
    "aggregator_env": {"FEDFAAS_AGGREGATOR_TOP_THREADS": "1"},
}


#: the round's variants (bench.dataplane_report.VARIANTS describes them): FedFaaS's default
#: round is the first, the one the others are compared with
DEFAULT, USERSPACE, LEAN, ONE_CORE_ROUND = (
    "FedFaaS",
    "FedFaaS, userspace router",
    "FedFaaS, lean",
    "FedFaaS, one core",
)


def variants(
    work: Path, layout: list[tuple[str, list[int]]], clients: int, *, ebpf: bool,
    rnd: dict[str, Any],
) -> dict[str, Runner]:  # fmt: skip
    """FedFaaS's round variants: the default (``rnd``'s settings, the eBPF router where it
    loads), the same with the userspace router (its peer; left out when eBPF cannot load:
    the default is already that), the lean settings (I=4, one upload at once) and the
    default with the top and the publication on one thread each."""

    def fed(router_ebpf: bool, **kw: Any) -> Runner:
        return lambda groups, tag: bench_round_e2e(
            work, layout, clients, ebpf=router_ebpf, tag=tag, groups=groups, **kw
        )

    out = {DEFAULT: fed(ebpf, **rnd)}
    if ebpf:
        out[USERSPACE] = fed(False, **rnd)
    out[LEAN] = fed(ebpf, **{**rnd, "fanout": 4, "max_inflight": 1})
    out[ONE_CORE_ROUND] = fed(ebpf, **rnd, **ONE_CORE)
    return out


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
        help="run only the same-CPUs comparison (no ingest, fold or round variants)",
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
    stop_on_sigterm()  # a SIGTERM still takes the run's processes, groups and files down
    out_dir = Path(a.out) if a.out else RESULTS
    if a.from_json:
        print(rerender("dataplane", report.render, report.plot, out_dir))
        return 0
    import bpf
    from bench.harness import round_clients as rc
    from bench.harness.cgroups import parse_cpus
    from bench.harness.compare import run_compare
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

        # the round's variants, FedFaaS only, repeated and alternating as the systems are; in
        # a folder of their own: the default's runs on the comparison's CPUs have its tags
        res["variants"] = run_compare(
            variants(work / "v", layout, clients, ebpf=ebpf, rnd=rnd),
            cpus_sets=[_cpu_list(sorted(os.sched_getaffinity(0)))],
            repeats=a.repeats,
            after_run=lambda cmp: _write({**res, "variants": cmp}, out_dir, quiet=True),
        )
    _write(res, out_dir)
    return 0


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
