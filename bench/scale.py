"""Growth curves: one FL round's time, server memory and server CPU-seconds, FedFaaS against
Flower (1.42 and 1.32.1's legacy path) and SF (LIFL's serverful baseline), in one run, against the number of clients and
against the model's size (issue 37's memory and CPU goals).

- against clients: 20, 40, 60, 120 and 200 clients of ResNet-18 (its floating-point state
  dict, float32, 44.8 MB);
- against model size: 10 MB, 240 MB and 1 GB at 20 clients (ResNet-18 itself at 20 clients is
  the first point of the clients axis); the sizes other than ResNet-18's are its 102 tensors
  with every size scaled (:func:`bench.harness.round_clients.scaled_layout`).

Every point is a same-CPUs comparison (:func:`bench.harness.compare.run_compare`): FedFaaS
(:func:`bench.harness.fedfaas_round.bench_round_e2e`: one node gateway, warm ``aggregator``
replicas, the eBPF router where ``bpf.probe()`` says it loads, else userspace), Flower 1.42 on
the API its docs recommend (:func:`bench.flower_baseline.run_flower_round`), Flower 1.32.1's
legacy gRPC path (:func:`bench.harness.flower_legacy.run_legacy_round`: the two Flowers move
updates differently, so both are peers) and SF (:func:`bench.harness.sf_round.run_sf_round`),
``--repeats`` times each (default :data:`bench.harness.compare.REPEATS`), the systems
alternating, every run in fresh cgroups (:mod:`bench.harness.cgroups`): the server side born
in a group pinned to ``--cpus``, the clients in another. Per system and point: the median and
min-max of the round (first client's weights in memory, before serialisation -> global model
available), of the server window (first update bytes received on the server's port -> the
same end), of the server group's peak memory (``memory.max_usage_in_bytes``, reset as the
clients are released: every page charged once, shared memory included), of its CPU-seconds
in the round (``cpuacct.usage``) and of the clients group's peak; FedFaaS's design floor
(computed from its settings, :func:`bench.harness.fedfaas_round.design_floor`) beside its
peak; ratios of medians. The report (:mod:`bench.scale_report`) checks issue 37's targets on
the medians: memory against Flower at 20, 40 and 60 clients, CPU-seconds against Flower and
SF at 20 and 120, FedFaaS's peak within 1.15x its floor and flat (max/min <= 1.1) from 20 to
200 clients. Every client is its own process on this machine; all are released at once.

A run that cannot finish is a result, not a crash: the memory guard stops it when the server
side's summed RSS passes ``--server-mem-limit-gb`` or the machine's available memory falls
under ``--floor-gb`` ("killed at N GB"), the system under test errors or it times out; the
point's row counts it as not finished and names what stopped it. A system none of whose runs
finished at a point (stopped by the guard or the timeout) is left out of the larger points of
that axis (:func:`left_out`; the report names them). The result is written after every run.

Usage: ``python -m bench.scale [--repeats 5] [--cpus 0-1] [--clients 20,40]
[--sizes-mb 10,240] [--systems "FedFaaS,Flower 1.32.1 legacy"] [--quick] [--merge] [--out DIR]``;
writes ``bench/results/scale.{json,md,png}`` and prints the tables. ``--merge`` keeps the stored
result's points this run does not run again, when that result comes from the same clean commit
(:func:`merged_from`): the two axes can be two runs (``--sizes-mb ''``, then ``--clients ''
--merge``) and still one result, each earlier run's record under ``earlier_runs``. ``--quick`` is a smoke run (2 and
4 clients of a 1 MB model; 4 MB with 2 clients).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scale_report as report
from bench.flower_baseline import CURRENT, LEGACY
from bench.harness import round_clients as rc
from bench.harness.compare import REPEATS, Runner
from bench.runinfo import pinned_threads, rerender, run_info, stop_on_sigterm, write_result

RESULTS = Path(__file__).resolve().parent / "results"

#: the clients axis (ResNet-18); the first count is the size axis' client count too
CLIENTS = (20, 40, 60, 120, 200)
#: the size axis' other sizes (bytes), at CLIENTS[0] clients
SIZES = (10_000_000, 240_000_000, 1_000_000_000)
QUICK_CLIENTS = (2, 4)
QUICK_SIZES = (4_000_000,)
QUICK_CLIENTS_SIZE = 1_000_000
#: the systems of every point, FedFaaS first (the one the others are compared with)
SYSTEMS = ("FedFaaS", CURRENT, LEGACY, "SF")


def points(
    quick: bool = False,
    clients: tuple[int, ...] | None = None,
    sizes: tuple[int, ...] | None = None,
) -> list[dict[str, Any]]:
    """The grid: ``{"axis": "clients" | "size", "clients": n, "update_bytes": b}`` in run
    order (each axis from small to large); ``clients`` / ``sizes`` replace the axes'
    defaults (an empty tuple leaves that axis out)."""
    base = QUICK_CLIENTS_SIZE if quick else 4 * rc.RESNET18_VALUES
    ns = (QUICK_CLIENTS if quick else CLIENTS) if clients is None else clients
    bs = (QUICK_SIZES if quick else SIZES) if sizes is None else sizes
    at = ns[0] if ns else (QUICK_CLIENTS if quick else CLIENTS)[0]
    return [
        *({"axis": "clients", "clients": n, "update_bytes": base} for n in sorted(ns)),
        *({"axis": "size", "clients": at, "update_bytes": b} for b in sorted(bs) if b != base),
    ]


def runners(
    work: Path, p: dict[str, Any], *, ebpf: bool, guard: dict[str, Any], systems: tuple[str, ...]
) -> dict[str, Runner]:
    """Each system's round at point ``p`` (the memory guard ``guard`` on every one)."""
    from bench.flower_baseline import run_flower_round
    from bench.harness.fedfaas_round import bench_round_e2e
    from bench.harness.flower_legacy import run_legacy_round
    from bench.harness.sf_round import run_sf_round

    layout = rc.scaled_layout(rc.resnet18_layout(), p["update_bytes"])
    n = p["clients"]
    every: dict[str, Runner] = {
        "FedFaaS": lambda groups, tag: bench_round_e2e(
            work, layout, n, ebpf=ebpf, tag=tag, groups=groups, **guard
        ),
        CURRENT: lambda groups, tag: run_flower_round(n, layout, groups=groups, **guard),
        LEGACY: lambda groups, tag: run_legacy_round(n, layout, groups=groups, **guard),
        "SF": lambda groups, tag: run_sf_round(work, layout, n, groups=groups, tag=tag, **guard),
    }
    return {s: every[s] for s in systems}


def run_point(
    work: Path,
    p: dict[str, Any],
    *,
    ebpf: bool,
    limit: int,
    floor: int,
    timeout: float,
    cpus: str | None = None,
    repeats: int = REPEATS,
    systems: tuple[str, ...] = SYSTEMS,
    after_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Point ``p`` of the grid: its systems' rounds, ``repeats`` each, alternating, on the
    server CPUs ``cpus`` (None: every CPU this process may use). Returns the point with its
    ``cpus`` and ``compare`` (:func:`bench.harness.compare.run_compare`'s result);
    ``after_run`` gets the point as it stands after every run."""
    from bench.harness.compare import run_compare

    cpus = cpus or ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    layout = rc.scaled_layout(rc.resnet18_layout(), p["update_bytes"])
    out: dict[str, Any] = {**p, "num_tensors": len(layout), "cpus": cpus}
    guard = {"mem_limit_bytes": limit, "floor_bytes": floor, "timeout": timeout}

    def keep(cmp: dict[str, Any]) -> None:
        out["compare"] = cmp
        if after_run is not None:
            after_run(out)

    keep(
        run_compare(
            runners(work, p, ebpf=ebpf, guard=guard, systems=systems),
            cpus_sets=[cpus],
            repeats=repeats,
            after_run=keep,
        )
    )
    return out


def left_out(done: list[dict[str, Any]], p: dict[str, Any]) -> dict[str, str]:
    """The systems point ``p`` leaves out, and why: a system none of whose runs finished at a
    smaller point of the same axis (the memory guard stopped them or they timed out) would
    not finish a larger one either; its runs there would only take the machine's time."""
    out: dict[str, str] = {}
    for q in done:
        if q["axis"] != p["axis"] or q[_SIZE[q["axis"]]] >= p[_SIZE[p["axis"]]]:
            continue
        out.update(q.get("left_out") or {})
        for system, s in ((report.summary(q) or {}).get("systems") or {}).items():
            stopped = {str(f).split()[0].rstrip(":") for f in s["failures"]}
            if s["runs"] and not s["ok"] and stopped <= {"killed", "timeout"}:
                what = f"{q['clients']} clients x {q['update_bytes'] / 1e6:.1f} MB"
                out.setdefault(system, f"no run finished at {what} ({', '.join(sorted(stopped))})")
    return out


#: what grows along each axis
_SIZE = {"clients": "clients", "size": "update_bytes"}


def _key(p: dict[str, Any]) -> tuple[str, int, int]:
    return (p["axis"], int(p["clients"]), int(p["update_bytes"]))


def merged_from(
    stored: Path, run: dict[str, Any], grid: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """For ``--merge``: the points of the stored result ``stored`` that ``grid`` does not
    run again, and the run records they came from (its ``run`` and its ``earlier_runs``).
    Raises ``ValueError`` saying why when they cannot join this run's result: no stored
    result, or one from another commit or an uncommitted tree (``run``: this run's record)."""
    if not stored.exists():
        raise ValueError(f"--merge: no {stored} to merge with")
    old = json.loads(stored.read_text())
    mine, theirs = run.get("commit") or {}, (old.get("run") or {}).get("commit") or {}
    if not mine.get("sha") or mine.get("dirty") is not False:
        raise ValueError(f"--merge: this tree is not a clean commit ({mine})")
    if theirs.get("sha") != mine["sha"] or theirs.get("dirty") is not False:
        raise ValueError(
            f"--merge: {stored} comes from {theirs.get('sha')} (dirty: {theirs.get('dirty')}), "
            f"not this clean commit {mine['sha']}"
        )
    again = {_key(p) for p in grid}
    kept = [p for p in old.get("points") or [] if _key(p) not in again]
    return kept, [*(old.get("earlier_runs") or []), old["run"]]


def _ints(text: str | None, scale: float = 1.0) -> tuple[int, ...] | None:
    """``"20,40"`` -> ``(20, 40)`` (each times ``scale``); None stays None, ``""`` is ``()``."""
    if text is None:
        return None
    return tuple(int(float(x) * scale) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke sizes (a few clients, 1-4 MB)")
    p.add_argument("--out", help="results folder (default bench/results)")
    p.add_argument("--repeats", type=int, default=REPEATS, help="runs per system and point")
    p.add_argument("--clients", help="the clients axis, comma-separated (default 20,...,200)")
    p.add_argument("--sizes-mb", help="the size axis in MB, comma-separated ('' leaves it out)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="systems compared, FedFaaS first")
    p.add_argument(
        "--server-mem-limit-gb",
        type=float,
        default=16.0,
        help="stop a run when the server side's summed RSS passes this (0: no limit)",
    )
    p.add_argument(
        "--floor-gb",
        type=float,
        default=3.0,
        help="stop a run when the machine's available memory falls under this",
    )
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    p.add_argument(
        "--cpus",
        help="the CPUs every system's server processes are pinned to (cpuset syntax, e.g. 0-1; "
        "default: every CPU this process may use)",
    )
    p.add_argument(
        "--from-json", action="store_true", help="re-render scale.md/png from scale.json"
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the stored scale.json's points that this run's grid does not have (it must "
        "come from this commit, clean): one axis per run, one result",
    )
    a = p.parse_args(argv)
    stop_on_sigterm()  # a SIGTERM still takes the point's processes, groups and files down
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out_dir = Path(a.out) if a.out else RESULTS
    if a.from_json:
        print(rerender("scale", report.render, report.plot, out_dir))
        return 0
    systems = tuple(s.strip() for s in a.systems.split(","))
    if systems[0] != "FedFaaS" or not set(systems) <= set(SYSTEMS):
        p.error(f"--systems: FedFaaS first, then any of {', '.join(SYSTEMS[1:])}")
    if a.cpus:
        from bench.harness.cgroups import parse_cpus

        parse_cpus(a.cpus)  # a bad set fails now, not after an hour of rounds
    import bpf

    run = run_info("bench.scale", sys.argv[1:] if argv is None else argv)
    mode, reason = bpf.probe()
    limit, floor = int(a.server_mem_limit_gb * 1e9), int(a.floor_gb * 1e9)
    grid = points(a.quick, _ints(a.clients), _ints(a.sizes_mb, 1e6))
    kept: list[dict[str, Any]] = []
    earlier: list[dict[str, Any]] = []
    if a.merge:
        try:
            kept, earlier = merged_from(out_dir / "scale.json", run, grid)
        except ValueError as exc:
            p.error(str(exc))
    with (
        pinned_threads(1) as threads,
        tempfile.TemporaryDirectory(prefix="fedfaas-bench-scale-") as tmp,
    ):
        res: dict[str, Any] = {
            "run": run,
            "config": {
                "quick": a.quick,
                "threads": threads,
                "router_probe": {"mode": mode, "reason": reason},
                "server_mem_limit_bytes": limit,
                "floor_bytes": floor,
                "timeout_s": a.timeout,
                "server_cpus": a.cpus,
                "repeats": a.repeats,
                "systems": list(systems),
                "model": "ResNet-18 (10 classes) floating-point state dict, float32; other sizes "
                "scale every tensor",
            },
            "points": list(kept),
        }
        if earlier:
            res["earlier_runs"] = earlier
        for pt in grid:
            gone = left_out(res["points"], pt)
            pt = {**pt, "left_out": gone}
            res["points"].append(pt)

            def keep(now: dict[str, Any]) -> None:
                """The point as it stands, written: a run cut short keeps what it did."""
                res["points"][-1] = now
                _write(res, out_dir)

            run_point(
                Path(tmp), pt, ebpf=mode == "ebpf", limit=limit, floor=floor,
                timeout=a.timeout, cpus=a.cpus, repeats=a.repeats,
                systems=tuple(s for s in systems if s not in gone), after_run=keep,
            )  # fmt: skip
    print(_write(res, out_dir))
    return 0


def _write(res: dict[str, Any], out_dir: Path) -> str:
    stored, md = write_result(res, "scale", report.render, out_dir)
    report.plot(stored, out_dir / "scale.png")
    return md


if __name__ == "__main__":
    raise SystemExit(main())
