"""The report of ``bench.scale``: its tables, issue 37's targets and the plot, rendered from its
JSON as written.

Every figure is a median over a point's finished runs with its [min-max]
(:func:`bench.harness.compare.summarise`); every ratio is a ratio of medians. :func:`targets`
checks the medians against issue 37's goals (met or **miss**, never left out); :func:`shape`
gives the curves' shape (FedFaaS's peak from the smallest to the largest client count, seconds
of round per GB received).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.harness.compare import SERVER_COLUMNS
from bench.runinfo import run_header

#: issue 37's goals on bench.scale's medians: (figure, clients, baseline, at least this ratio)
RATIO_TARGETS = (
    ("server_peak_bytes", 20, "Flower", 3.0),
    ("server_peak_bytes", 60, "Flower", 8.0),
    ("server_cpu_s", 20, "Flower", 5.0),
    ("server_cpu_s", 20, "SF", 2.0),
    ("server_cpu_s", 120, "Flower", 5.0),
    ("server_cpu_s", 120, "SF", 2.0),
)
#: FedFaaS's server peak at most this times its design floor, at every client count
FLOOR_TARGET = 1.15
#: FedFaaS's server peak flat over the clients axis: largest median over smallest at most this
FLAT_TARGET = 1.1
#: the clients at which FedFaaS's memory is compared with Flower's without a target of its own
MEMORY_ALSO_AT = (40,)

#: the table's figures: column, figure key, scale
COLUMNS = (
    *SERVER_COLUMNS,
    ("clients peak GB (cgroup)", "client_peak_bytes", 1e9),
    ("server threads that ran", "threads_ran", 1.0),
)


def summary(p: Mapping[str, Any]) -> dict[str, Any] | None:
    """The point's :func:`~bench.harness.compare.summarise` (None before its first run)."""
    block = ((p.get("compare") or {}).get("by_cpus") or {}).get(p.get("cpus"))
    return None if block is None else dict(block["summary"])


def median(p: Mapping[str, Any], system: str, key: str) -> float | None:
    """The median of ``key`` over ``system``'s finished runs at point ``p`` (None: none)."""
    s = (summary(p) or {}).get("systems", {}).get(system) or {}
    return None if not s.get(key) else float(s[key]["median"])


def _cell(s: Mapping[str, float] | None, scale: float = 1.0) -> str:
    if not s:
        return "—"
    digits = 0 if scale == 1.0 and s["max"] >= 100 and float(s["median"]).is_integer() else 2
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'] / scale)} [{f.format(s['min'] / scale)}-{f.format(s['max'] / scale)}]"


def _axis_rows(pts: list[dict[str, Any]], axis: str) -> list[str]:
    cols = " | ".join(c for c, _, _ in COLUMNS)
    rows = [
        f"| clients | MB | system | runs finished | {cols} | FedFaaS floor GB; peak / floor "
        "| baseline / FedFaaS (medians): round, server window, peak, CPU-s |",
        "|---|---|---|---|" + "---|" * len(COLUMNS) + "---|---|",
    ]
    for p in _on_axis(pts, axis):
        summ = summary(p)
        if summ is None:
            continue
        for system, s in summ["systems"].items():
            fails = ", ".join(str(f) for f in s["failures"])
            cells = " | ".join(_cell(s.get(k), scale) for _, k, scale in COLUMNS)
            floor = (
                f"{_cell(s.get('floor_bytes'), 1e9)}; {_cell(s.get('peak_over_floor'))}"
                if s.get("floor_bytes")
                else ""
            )
            r = summ["ratios"].get(system) or {}
            ratios = ", ".join(
                "—" if r.get(k) is None else f"{r[k]:.2f}x"
                for k in ("e2e_s", "server_s", "server_peak_bytes", "server_cpu_s")
            )
            rows.append(
                f"| {p['clients']} | {p['update_bytes'] / 1e6:.1f} | {system} | {s['ok']}/"
                f"{s['runs']}{' (' + fails + ')' if fails else ''} | {cells} | {floor} | "
                f"{ratios if r else ''} |"
            )
    return rows


def _on_axis(pts: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """The points of ``axis``; the size axis also shows the clients axis' point at its client
    count (ResNet-18 at 20 clients is measured once, for both)."""
    if axis == "clients":
        return [p for p in pts if p["axis"] == "clients"]
    sized = [p for p in pts if p["axis"] == "size"]
    at = {p["clients"] for p in sized}
    shared = [p for p in pts if p["axis"] == "clients" and p["clients"] in at]
    return sorted(sized + shared, key=lambda p: p["update_bytes"])


def targets(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 37's goals on the clients axis' medians: each ``{"target", "value", "met"}``
    (``value`` None and ``met`` False where a system did not finish or was not run)."""
    by_n = {p["clients"]: p for p in pts if p["axis"] == "clients" and summary(p)}
    out = []

    def ratio(key: str, n: int, baseline: str) -> float | None:
        p = by_n.get(n)
        return None if p is None else (summary(p) or {})["ratios"].get(baseline, {}).get(key)

    # "Flower": every Flower compared (1.42 and the legacy path), each its own line
    flowers = [s for s in _systems(pts) if s.startswith("Flower")] or ["Flower"]
    for key, n, baseline, goal in RATIO_TARGETS:
        for b in flowers if baseline == "Flower" else [baseline]:
            v = ratio(key, n, b)
            word = "memory" if key == "server_peak_bytes" else "CPU-seconds"
            out.append({"target": f"server {word} at {n} clients >= {goal:g}x below {b}",
                        "value": v, "met": v is not None and v >= goal})  # fmt: skip
    for n in MEMORY_ALSO_AT:
        for b in flowers:
            v = ratio("server_peak_bytes", n, b)
            out.append({"target": f"server memory at {n} clients below {b} (no target)",
                        "value": v, "met": None})  # fmt: skip
    for n, p in sorted(by_n.items()):
        v = median(p, "FedFaaS", "peak_over_floor")
        out.append({"target": f"FedFaaS peak <= {FLOOR_TARGET}x its design floor at {n} clients",
                    "value": v, "met": v is not None and v <= FLOOR_TARGET})  # fmt: skip
    peaks = {n: median(p, "FedFaaS", "server_peak_bytes") for n, p in by_n.items()}
    got = [v for v in peaks.values() if v]
    flat = max(got) / min(got) if len(got) >= 2 and len(got) == len(peaks) else None
    span = f"{min(by_n)} to {max(by_n)}" if by_n else "no"
    out.append({"target": f"FedFaaS peak flat from {span} clients: max/min <= {FLAT_TARGET}",
                "value": flat, "met": flat is not None and flat <= FLAT_TARGET})  # fmt: skip
    return out


def shape(pts: list[dict[str, Any]], system: str) -> dict[str, Any]:
    """The curves' shape for one system's finished points (medians): its peak from the
    smallest to the largest client count (1.0 is flat) and, at every point, seconds of round
    per GB received (clients x update bytes: constant when time is linear in bytes)."""
    done = [p for p in pts if median(p, system, "e2e_s") is not None]
    by_clients = sorted((p for p in done if p["axis"] == "clients"), key=lambda p: p["clients"])
    growth = None
    if len(by_clients) >= 2:
        lo, hi = by_clients[0], by_clients[-1]
        a, b = (median(x, system, "server_peak_bytes") for x in (lo, hi))
        if a and b:
            growth = {"from_clients": lo["clients"], "to_clients": hi["clients"],
                      "peak_ratio": b / a}  # fmt: skip
    per_gb = [
        {
            "axis": p["axis"],
            "clients": p["clients"],
            "update_bytes": p["update_bytes"],
            "s_per_gb": (median(p, system, "e2e_s") or 0.0)
            / (p["clients"] * p["update_bytes"] / 1e9),
        }
        for p in done
    ]
    return {"peak_growth_over_clients": growth, "s_per_gb_received": per_gb}


def _systems(pts: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for p in pts:
        for s in (summary(p) or {}).get("systems", {}):
            seen[s] = None
    return list(seen)


def render(r: dict[str, Any]) -> str:
    """The Markdown of a scale result (from its JSON)."""
    pts = [p for p in r["points"] if summary(p)]
    cfg = r["config"]
    lines = [
        "# bench: scale",
        "",
        run_header(r["run"]),
        "",
        f"Every point compares {', '.join(cfg.get('systems') or _systems(pts))} on the same "
        f"CPUs ({cfg.get('server_cpus') or 'every CPU'}), {cfg.get('repeats')} runs each, the "
        "systems alternating; each cell is the median [min-max] over the runs that finished, "
        "ratios are of medians. **round** = first client's weights in memory as float32 arrays "
        "(before serialisation) -> global model available; **server window** = first update "
        "bytes received on the server's TCP port (kernel counters) -> the same end; **peak** = "
        "the peak of the server side's cgroup (memory.max_usage_in_bytes, reset as the clients "
        "are released: every page charged once, shared memory included; FedFaaS: gateway, "
        "aggregator replicas, Redis; Flower: SuperLink, SuperExec, ServerApp; SF: its leaf and "
        "top servers), its clients in a cgroup of their own; **server CPU-s** = the server "
        "cgroup's CPU-seconds (cpuacct) over the same window; FedFaaS's **floor** = in-flight "
        "uploads + accumulators + published global + idle processes, computed from its settings. "
        "Every client is its own process on this machine, all released at once. BLAS/OpenMP "
        f"pinned to {cfg['threads']['requested']} thread in every process. Memory guard: server "
        f"RSS limit {cfg['server_mem_limit_bytes'] / 1e9:.1f} GB (0 = none), machine floor "
        f"{cfg['floor_bytes'] / 1e9:.1f} GB available; timeout {cfg['timeout_s']:.0f} s per run. "
        f"Router: {cfg['router_probe']['mode']} ({cfg['router_probe']['reason']}).",
        "",
        "## Issue 37's targets (medians)",
        "",
        "| target | value | met |",
        "|---|---|---|",
    ]
    for t in targets(pts):
        v = "not measured" if t["value"] is None else f"{t['value']:.2f}x"
        met = "" if t["met"] is None else ("met" if t["met"] else "**miss**")
        lines.append(f"| {t['target']} | {v} | {met} |")
    lines += ["", "## Against clients", "", *_axis_rows(pts, "clients")]
    if any(p["axis"] == "size" for p in pts):
        lines += ["", "## Against model size", "", *_axis_rows(pts, "size")]
    gone = [
        f"- {system}, {p['clients']} clients x {p['update_bytes'] / 1e6:.1f} MB: not run, {why}"
        for p in pts
        for system, why in (p.get("left_out") or {}).items()
    ]
    if gone:
        lines += ["", "## Left out (a smaller point of the same axis did not finish)", "", *gone]
    lines += ["", "## Shape (DESIGN.md: server memory flat in clients, round time linear in bytes)", ""]  # fmt: skip
    for system in _systems(pts):
        sh = shape(pts, system)
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
        lines.append(f"- {system}: {growth}; s per GB received: {rates or 'none finished'}")
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    """Two panels (against clients, against model size): each system's median round time
    (solid, min-max bars) and server peak (dashed, right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in r["points"] if summary(p)]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    colours = {"FedFaaS": "tab:green", "SF": "tab:blue"}
    for ax, axis, xkey in ((axes[0], "clients", "clients"), (axes[1], "size", "update_bytes")):
        on = _on_axis(pts, axis)
        if not on:
            continue
        div = 1e6 if xkey == "update_bytes" else 1
        mem_ax = ax.twinx()
        for system in _systems(on):
            xs, ts, lo, hi, ms = [], [], [], [], []
            for p in on:
                s = (summary(p) or {})["systems"].get(system) or {}
                if not s.get("e2e_s"):
                    continue
                e = s["e2e_s"]
                xs.append(p[xkey] / div)
                ts.append(e["median"])
                lo.append(e["median"] - e["min"])
                hi.append(e["max"] - e["median"])
                peak = s.get("server_peak_bytes")
                ms.append(peak["median"] / 1e9 if peak else float("nan"))
            legacy = "legacy" in system
            colour = colours.get(system, "tab:purple" if legacy else "tab:red")
            ax.errorbar(xs, ts, yerr=[lo, hi], fmt="o-", color=colour, capsize=3,
                        label=f"{system} round (s)")  # fmt: skip
            mem_ax.plot(xs, ms, "s--", color=colour, alpha=0.6, label=f"{system} peak (GB)")
        ax.set_xscale("log")
        ticks = sorted({p[xkey] / div for p in on})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("clients" if axis == "clients" else "model size, MB")
        ax.set_ylabel("round: weights in memory -> global (s), median [min-max]")
        mem_ax.set_ylabel("server cgroup peak (GB), median")
        a, b = ax.get_legend_handles_labels(), mem_ax.get_legend_handles_labels()
        ax.legend(a[0] + b[0], a[1] + b[1], fontsize=7, loc="upper left")
        ax.set_title(f"against {'clients' if axis == 'clients' else 'model size'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
