"""Growth curves: one FL round's time and server peak memory, FedFaaS and Flower, in one run,
against the number of clients and against the model's size.

- against clients: 10, 50, 100, 200 clients of ResNet-18 (its floating-point state dict,
  float32, 44.8 MB);
- against model size: 10 MB, 44.8 MB (ResNet-18 itself), 240 MB, 1 GB, 20 clients; the sizes
  other than ResNet-18's are its 102 tensors with every size scaled
  (:func:`bench.harness.rc.scaled_layout`).

Each point runs FedFaaS (:func:`bench.harness.fedfaas_round.bench_round_e2e`: one node
gateway, warm ``aggregator`` replicas, the eBPF router where ``bpf.probe()`` says it loads, else userspace;
clients upload through ``FLClient.upload``) and then Flower
(:func:`bench.flower_baseline.run_flower_round`), measured alike
(:mod:`bench.harness.round_window`): the round from the first client's weights in memory (before
serialisation) to the global model available, the server-side window from the first update
bytes received on the server's port; and by cgroup (:mod:`bench.harness.cgroups`: each side's
server processes born in a group of their own, pinned to ``--cpus``, its clients in another)
the server side's peak memory (``memory.max_usage_in_bytes``, reset as the clients are
released: every page charged once) and its CPU-seconds in the round (``cpuacct.usage``).
Results written before the cgroups hold a sampled peak or the summed ``VmHWM``. Every client
is its own process on this machine; all are released at once.

A point that cannot finish is a result, not a crash: the memory guard stops it when the server
side's summed RSS passes ``--server-mem-limit-gb`` or the machine's available memory falls
under ``--floor-gb`` ("killed at N GB", with the server's and the clients' RSS then), the system
under test errors (e.g. a gRPC message limit) or it times out. Results are written after every
point.

Usage: ``python -m bench.scale [--quick] [--cpus 0-1] [--out DIR]``; writes ``bench/results/scale.{json,md,png}``
and prints the tables. ``--quick`` is a smoke run (2 and 4 clients of a 1 MB model; 1 MB and
4 MB with 3 clients).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.runinfo import (
    PINNED_THREADS,
    pinned_threads,
    rerender,
    run_header,
    run_info,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results"

CLIENTS = (10, 50, 100, 200)
SIZES = (10_000_000, 4 * rc.RESNET18_VALUES, 240_000_000, 1_000_000_000)
SIZE_AXIS_CLIENTS = 20

QUICK_CLIENTS = (2, 4)
QUICK_SIZES = (1_000_000, 4_000_000)
QUICK_SIZE_AXIS_CLIENTS = 3
QUICK_CLIENTS_SIZE = 1_000_000


#: a side's peak-memory key: its server cgroup's peak (older results: their sampled peak or
#: summed VmHWM, which ``rw.server_peak`` reads)
PEAK = "server_peak_bytes"
#: a side's server CPU-seconds in the round, from its server cgroup
CPU = "server_cpu_s"


def _server_group(rec: dict[str, Any]) -> dict[str, Any]:
    return dict((rec.get("cgroup") or {}).get("server") or {})


def _peak(rec: dict[str, Any]) -> float:
    """The server side's peak (:func:`~bench.harness.round_window.server_peak`: its cgroup's,
    else what an older result stored)."""
    return rw.server_peak(rec) or 0.0


def _value(rec: dict[str, Any], key: str) -> float | None:
    if key == PEAK:
        return _peak(rec)
    if key == CPU:
        return _server_group(rec).get("cpu_s")
    v = rec.get(key)
    return None if v is None else float(v)


def points(quick: bool = False) -> list[dict[str, Any]]:
    """The grid: ``{"axis": "clients" | "size", "clients": n, "update_bytes": b}`` in run
    order (each axis from small to large)."""
    if quick:
        return [
            *(
                {"axis": "clients", "clients": n, "update_bytes": QUICK_CLIENTS_SIZE}
                for n in QUICK_CLIENTS
            ),
            *(
                {"axis": "size", "clients": QUICK_SIZE_AXIS_CLIENTS, "update_bytes": b}
                for b in QUICK_SIZES
            ),
        ]
    resnet = 4 * rc.RESNET18_VALUES
    return [
        *({"axis": "clients", "clients": n, "update_bytes": resnet} for n in CLIENTS),
        *({"axis": "size", "clients": SIZE_AXIS_CLIENTS, "update_bytes": b} for b in SIZES),
    ]


def guarded(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    """``fn(*args, **kw)``, or the failure record of the exception it raised: one point's
    failure never stops the benchmark."""
    try:
        return dict(fn(*args, **kw))
    except Exception as exc:  # noqa: BLE001 - recorded as the point's result
        return rw.failure("error", f"{type(exc).__name__}: {exc}"[:2000])


def run_point(
    work: Path,
    p: dict[str, Any],
    *,
    ebpf: bool,
    limit: int,
    floor: int,
    timeout: float,
    cpus: str | None = None,
) -> dict[str, Any]:
    """FedFaaS then Flower at one point of the grid, each side's server processes and clients
    in cgroups of their own (:class:`~bench.harness.cgroups.RoundGroups`), the server side
    pinned to ``cpus`` (None: every CPU this process may use)."""
    from bench.flower_baseline import run_flower_round
    from bench.harness.cgroups import RoundGroups
    from bench.harness.fedfaas_round import bench_round_e2e

    layout = rc.scaled_layout(rc.resnet18_layout(), p["update_bytes"])
    guard = {"mem_limit_bytes": limit, "floor_bytes": floor, "timeout": timeout}
    out = dict(p)
    out["num_tensors"] = len(layout)
    name = f"fedfaas-bench-{os.getpid()}-scale-{p['axis'][0]}{p['clients']}c{p['update_bytes']}b"
    t = time.monotonic()
    with RoundGroups(f"{name}-fedfaas", cpus) as groups:
        out["fedfaas"] = guarded(
            bench_round_e2e,
            work,
            layout,
            p["clients"],
            ebpf=ebpf,
            tag=p["axis"][0],
            groups=groups,
            **guard,
        )
    out["fedfaas"]["wall_s"] = time.monotonic() - t
    t = time.monotonic()
    with RoundGroups(f"{name}-flower", cpus) as groups:
        out["flower"] = guarded(run_flower_round, p["clients"], layout, groups=groups, **guard)
    out["flower"]["wall_s"] = time.monotonic() - t
    for side in ("fedfaas", "flower"):  # what every process of the point was started with
        out[side]["threads_env"] = dict(PINNED_THREADS)
    return out


# ----------------------------------------------------------------------------- report
def _cell(x: dict[str, Any], key: str, scale: float = 1.0, *, label: bool = False) -> str:
    """A figure, or for a point that did not finish what stopped it (``label``: the first
    column of that side) or a dash."""
    if not x.get("ok", True):
        return rw.killed_at(x) if label else "—"
    v = _value(x, key)
    return "n/a" if v is None else f"{v / scale:.2f}"


def _threads(x: dict[str, Any]) -> str:
    """The pinned count, and the pools the side's processes measured (server; client)."""
    env = x.get("threads_env") or {}
    out = "/".join(sorted(set(env.values()))) or "?"
    pools = x.get("thread_pools") or {}
    seen = sorted({p["threads"] for role in pools.values() for p in role})
    return out + (f" (measured {'/'.join(map(str, seen))})" if seen else "")


def _rows(pts: list[dict[str, Any]], axis: str) -> list[str]:
    rows = [
        "| clients | MB | FedFaaS round s | Flower round s | FedFaaS server-window s | "
        "Flower server-window s | FedFaaS peak GB | Flower peak GB | FedFaaS server CPU-s | "
        "Flower server CPU-s | router | threads (BLAS/OpenMP, every process) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in pts:
        if p["axis"] != axis:
            continue
        f, fl = p["fedfaas"], p["flower"]
        rows.append(
            f"| {p['clients']} | {p['update_bytes'] / 1e6:.1f} | {_cell(f, 'e2e_s', label=True)} | "
            f"{_cell(fl, 'e2e_s', label=True)} | {_cell(f, 'server_s')} | {_cell(fl, 'server_s')} | "
            f"{_cell(f, PEAK, 1e9)} | {_cell(fl, PEAK, 1e9)} | {_cell(f, CPU)} | {_cell(fl, CPU)} | "
            f"{f.get('router', '')} | {_threads(f)} / {_threads(fl)} |"
        )
    return rows


def _failures(pts: list[dict[str, Any]]) -> list[str]:
    out = []
    for p in pts:
        for side in ("fedfaas", "flower"):
            x = p[side]
            if x.get("ok", True):
                continue
            sizes = ", ".join(
                f"{k} {x[k] / 1e9:.2f} GB"
                for k in ("server_rss_bytes", "client_rss_bytes", "available_bytes")
                if k in x
            )
            detail = " ".join(str(x["detail"]).split())[:400]
            out.append(
                f"- {side}, {p['clients']} clients x {p['update_bytes'] / 1e6:.1f} MB: "
                f"{x['failure']}{' (' + sizes + ')' if sizes else ''}: {detail}"
            )
    return out


def shape(pts: list[dict[str, Any]], side: str) -> dict[str, Any]:
    """What DESIGN.md asks of the curves, for one side's finished points: the peak's growth
    over the clients axis (largest finished count's peak over the smallest's: 1.0 is flat)
    and, at every finished point, seconds of round per GB received (clients x update bytes:
    constant when the round time is linear in bytes)."""
    done = [p for p in pts if p[side].get("ok", True)]
    by_clients = sorted((p for p in done if p["axis"] == "clients"), key=lambda p: p["clients"])
    growth = None
    if len(by_clients) >= 2:
        lo, hi = by_clients[0], by_clients[-1]
        growth = {
            "from_clients": lo["clients"],
            "to_clients": hi["clients"],
            "peak_ratio": _peak(hi[side]) / _peak(lo[side]),
        }
    per_gb = [
        {
            "axis": p["axis"],
            "clients": p["clients"],
            "update_bytes": p["update_bytes"],
            "s_per_gb": p[side]["e2e_s"] / (p["clients"] * p["update_bytes"] / 1e9),
        }
        for p in done
    ]
    return {"peak_growth_over_clients": growth, "s_per_gb_received": per_gb}


def _shape_lines(pts: list[dict[str, Any]]) -> list[str]:
    out = []
    for side, name in (("fedfaas", "FedFaaS"), ("flower", "Flower")):
        sh = shape(pts, side)
        g = sh["peak_growth_over_clients"]
        growth = (
            f"peak x{g['peak_ratio']:.2f} from {g['from_clients']} to {g['to_clients']} clients"
            if g
            else "peak growth: fewer than two finished client counts"
        )
        rates = ", ".join(
            f"{x['clients']}x{x['update_bytes'] / 1e6:.0f}MB {x['s_per_gb']:.2f}"
            for x in sh["s_per_gb_received"]
        )
        out.append(f"- {name}: {growth}; s per GB received: {rates or 'none finished'}")
    return out


def render(r: dict[str, Any]) -> str:
    """The Markdown of a scale result (from its JSON)."""
    pts = r["points"]
    cfg = r["config"]
    head = [
        "# bench: scale",
        "",
        run_header(r["run"]),
        "",
        "Both sides measured alike, one point at a time (FedFaaS, then Flower): **round** = first "
        "client's weights in memory as float32 arrays (before serialisation) -> global model "
        "available (FedFaaS: published by the gateway; Flower: aggregate_fit returned); "
        "**server window** = first update bytes received on the server's TCP port (kernel "
        "counters) -> the same end; **peak** = the peak of the server side's cgroup "
        "(memory.max_usage_in_bytes, reset as the clients are released: every page charged once, "
        "shared memory included; FedFaaS: gateway, aggregator replicas, Redis; Flower: its "
        "server), its clients in a cgroup of their own; **server CPU-s** = the server cgroup's "
        "CPU-seconds (cpuacct) over the same window; server side pinned to CPUs "
        f"{cfg.get('server_cpus') or 'all'}. Results stored before the cgroups hold a sampled "
        "peak or the sum of VmHWM. Every "
        "client is its own process on this machine, all released at once; FedFaaS clients "
        "serialise to safetensors and upload through FLClient.upload, Flower clients return "
        "arrays from fit and Flower serialises. BLAS/OpenMP pinned to "
        f"{cfg['threads']['requested']} thread in every process. Memory guard: server RSS "
        f"limit {cfg['server_mem_limit_bytes'] / 1e9:.1f} GB (0 = none), machine floor "
        f"{cfg['floor_bytes'] / 1e9:.1f} GB available; timeout {cfg['timeout_s']:.0f} s per side "
        f"and point. Router: {cfg['router_probe']['mode']} ({cfg['router_probe']['reason']}).",
        "",
        "## Against clients",
        "",
        *_rows(pts, "clients"),
        "",
        "## Against model size",
        "",
        *_rows(pts, "size"),
    ]
    head += [
        "",
        "## Shape (DESIGN.md: server memory flat in clients, round time linear in bytes)",
        "",
        *_shape_lines(pts),
    ]
    fails = _failures(pts)
    if fails:
        head += ["", "## Points that did not finish", "", *fails]
    return "\n".join(head) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    """Two panels (against clients, against model size), time on the left axis (solid) and
    peak memory on the right (dashed); a failed point is an x at its kill size, labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for ax, axis, xkey in ((axes[0], "clients", "clients"), (axes[1], "size", "update_bytes")):
        pts = [p for p in r["points"] if p["axis"] == axis]
        if not pts:
            continue
        if axis == "clients":
            xlabel = f"clients ({pts[0]['update_bytes'] / 1e6:.1f} MB each)"
        else:
            xlabel = f"model size, MB ({pts[0]['clients']} clients)"
        mem_ax = ax.twinx()
        for side, colour, name in (
            ("fedfaas", "tab:green", "FedFaaS"),
            ("flower", "tab:red", "Flower"),
        ):
            xs, ts, ms = [], [], []
            for p in pts:
                x = p[xkey] / (1e6 if xkey == "update_bytes" else 1)
                rec = p[side]
                if rec.get("ok", True):
                    xs.append(x)
                    ts.append(rec["e2e_s"])
                    ms.append(_peak(rec) / 1e9)
                else:
                    at = rec.get("server_rss_bytes", 0) / 1e9
                    mem_ax.plot([x], [at], "x", color=colour, ms=10)
                    mem_ax.annotate(rw.killed_at(rec), (x, at), fontsize=7, color=colour)
            ax.plot(xs, ts, "o-", color=colour, label=f"{name} round (s)")
            mem_ax.plot(xs, ms, "s--", color=colour, alpha=0.6, label=f"{name} peak (GB)")
        ax.set_xscale("log")
        ticks = [p[xkey] / (1e6 if xkey == "update_bytes" else 1) for p in pts]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel("round: weights in memory -> global (s)")
        mem_ax.set_ylabel("server peak, every page once (GB)")
        lines = ax.get_legend_handles_labels()
        more = mem_ax.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
        ax.set_title("against clients" if axis == "clients" else "against model size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(res: dict[str, Any], out_dir: Path) -> str:
    stored, md = write_result(res, "scale", render, out_dir)
    plot(stored, out_dir / "scale.png")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke sizes (a few clients, 1-4 MB)")
    p.add_argument("--out", help="results folder (default bench/results)")
    p.add_argument(
        "--server-mem-limit-gb",
        type=float,
        default=16.0,
        help="stop a point when the server side's summed RSS passes this (0: no limit)",
    )
    p.add_argument(
        "--floor-gb",
        type=float,
        default=3.0,
        help="stop a point when the machine's available memory falls under this",
    )
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per side and point")
    p.add_argument(
        "--cpus",
        help="the CPUs both sides' server processes are pinned to (cpuset syntax, e.g. 0-1; "
        "default: every CPU this process may use)",
    )
    p.add_argument(
        "--from-json", action="store_true", help="re-render scale.md/png from scale.json"
    )
    a = p.parse_args(argv)
    out_dir = Path(a.out) if a.out else RESULTS
    if a.from_json:
        print(rerender("scale", render, plot, out_dir))
        return 0
    import bpf

    run = run_info("bench.scale", sys.argv[1:] if argv is None else argv)
    mode, reason = bpf.probe()
    limit, floor = int(a.server_mem_limit_gb * 1e9), int(a.floor_gb * 1e9)
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
                "model": "ResNet-18 (10 classes) floating-point state dict, float32; other sizes "
                "scale every tensor",
            },
            "points": [],
        }
        for pt in points(a.quick):
            res["points"].append(
                run_point(
                    Path(tmp),
                    pt,
                    ebpf=mode == "ebpf",
                    limit=limit,
                    floor=floor,
                    timeout=a.timeout,
                    cpus=a.cpus,
                )
            )
            md = _write(res, out_dir)  # after every point: a run cut short keeps what it did
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
