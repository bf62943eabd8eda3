"""The report of ``bench.dataplane``: its table and plot, rendered from its JSON as written.

:func:`table` puts the same-CPUs comparison first (:func:`bench.harness.compare.compare_rows`),
then the single-run parts: ingest, fold, the round variants (:data:`ROUNDS`) with both
baselines and FedFaaS's ratio against each (:func:`round_rows`), the memory sweep
(:func:`sweep_rows`). :func:`render` is the Markdown file, :func:`plot` the figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.round_window import server_peak
from bench.runinfo import run_header

#: the round variants: result key, gateway config label
ROUNDS = (
    ("round", "default"),
    ("round_userspace", "default"),
    ("round_lean", "lean"),
    ("round_one_core", "default, one core for the top and the publication"),
)


def _sf(r: dict[str, Any]) -> dict[str, Any] | None:
    """The SF round's record, or None when it was not run (results written before it existed
    stored ``{"ran": False, "reason": ...}`` under ``round_sf``)."""
    sf = r.get("round_sf")
    return sf if sf and "ran" not in sf else None


def _baselines(r: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """The systems every FedFaaS round is compared with: Flower and SF (None: not run)."""
    return [("Flower", r.get("flower")), ("SF", _sf(r))]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def _ratio(other: float | None, mine: float | None, word: str) -> str:
    if not other or not mine:
        return ""
    return f"{other / mine:.1f}x {word}"


def _vs(peers: list[tuple[str, dict[str, Any] | None]], key: str, scale: float = 1.0) -> str:
    """Each baseline's figure: ``Flower 8.00; SF 3.00`` (or what stopped it, or not run)."""
    return "; ".join(f"{name} {_side(x, key, scale)}" for name, x in peers)


def _ratios(
    peers: list[tuple[str, dict[str, Any] | None]], mine: dict[str, Any], key: str, word: str
) -> str:
    """FedFaaS against each baseline that finished: ``4.0x faster than Flower; 1.5x ... SF``."""
    out = []
    for name, x in peers:
        if x and x.get("ok", True) and (t := _ratio(x.get(key), mine.get(key), word)):
            out.append(f"{t} than {name}")
    return "; ".join(out)


def _side(x: dict[str, Any] | None, key: str, scale: float = 1.0) -> str:
    """A figure of one side (``value / scale``), or what stopped it (``killed at 12.3 GB``)."""
    from bench.harness.round_window import killed_at

    if not x:
        return "(not run)"
    if not x.get("ok", True):
        return killed_at(x)
    v = x.get(key)
    return "n/a" if v is None else f"{v / scale:.2f}"


def _threads(r: dict[str, Any]) -> str:
    th = r.get("threads") or {}
    env = th.get("env") or {}
    pools = ", ".join(f"{p['library']} {p['threads']}" for p in th.get("pools") or [])
    return f"env {'/'.join(sorted(set(env.values()))) or '?'} in every process; bench {pools}"


def _measured(x: dict[str, Any] | None, name: str) -> str:
    """The BLAS/OpenMP thread counts one side's processes measured, by role."""
    pools = (x or {}).get("thread_pools") or {}
    return "; ".join(
        f"{name} {role} " + ", ".join(f"{p['library']} {p['threads']}" for p in ps)
        for role, ps in pools.items()
        if ps
    )


def _secondary(rnd: dict[str, Any]) -> str:
    """The bracketed memory figure of a round row: the sampled peak and its rate beside a
    cgroup peak; the summed VmHWM beside the sampled peak of a result stored before."""
    if not rnd.get("cgroup"):
        return _gb(rnd["server_hwm_bytes"])
    hz = rnd.get("server_peak_sample_hz")
    return f"sampled {_gb(rnd.get('server_peak_bytes') or 0)}" + (f" at {hz:.0f}/s" if hz else "")


def round_rows(r: dict[str, Any]) -> list[str]:
    peers = _baselines(r)
    rows = []
    for key, label in ROUNDS:
        rnd = r.get(key)
        if not rnd:
            continue
        measured = (_measured(rnd, "FedFaaS"), *(_measured(x, name) for name, x in peers))
        th = "; ".join(x for x in (_threads(r), *measured) if x)
        if not rnd.get("ok", True):
            rows.append(
                f"| round ({label}, {key}): FedFaaS failed | {_side(rnd, '')} | | | | {th} |"
            )
            continue
        cfg = (
            f"{label}: I={rnd['fanout']}, {rnd['max_inflight']} upload(s) at once, "
            f"{rnd['router']} router, {rnd['clients']} clients x "
            f"{rnd['update_bytes'] / 1e6:.1f} MB"
        )
        rows.append(
            f"| round ({cfg}): weights in client memory -> global model available (s); every "
            f"system: clients serialise inside the window, one process per client on this "
            f"machine, all released at once | {rnd['e2e_s']:.2f} | {_vs(peers, 'e2e_s')} | "
            f"{_ratios(peers, rnd, 'e2e_s', 'faster')} | >= 5x | {th} |"
        )
        rows.append(
            f"| round ({cfg}), server-side window only: first update bytes received on the "
            f"server's port (kernel TCP counters; SF: the earliest of its leaf servers' ports) "
            f"-> global available (s) | "
            f"{_side(rnd, 'server_s')} (gateway's own mark {rnd['server_gateway_mark_s']:.2f}) | "
            f"{_vs(peers, 'server_s')} | {_ratios(peers, rnd, 'server_s', 'faster')} | | {th} |"
        )
        mem = {"server_peak": server_peak(rnd)}
        mem_peers = [(n, x and {**x, "server_peak": server_peak(x)}) for n, x in peers]
        rows.append(
            f"| round ({cfg}): server peak memory, GB: every page counted once, the peak of the "
            f"server side's cgroup (memory.max_usage_in_bytes, reset as the window opens; "
            f"FedFaaS: gateway, aggregator replicas, Redis; Flower: its server process; SF: its "
            f"leaf servers and top), in brackets FedFaaS's sampled per-process peak and its "
            f"sample rate (results stored before the cgroups: the sampled peak, in brackets "
            f"the summed VmHWM) | {_gb(mem['server_peak'] or 0)} ({_secondary(rnd)}) | "
            f"{_vs(mem_peers, 'server_peak', 1e9)} | "
            f"{_ratios(mem_peers, mem, 'server_peak', 'less')} | >= 5x | {th} |"
        )
        if rnd.get("last_update_to_published_s") is not None:
            rows.append(
                f"| round ({cfg}), FedFaaS only: the tail, last update sealed -> global model "
                f"published, encoded and servable (s; of which -> global sealed) | "
                f"{rnd['last_update_to_published_s']:.3f} ({rnd['after_ingest_s']:.3f}) | | | | "
                f"{th} |"
            )
        if rnd.get("act_over_ingest"):
            rows.append(
                f"| round ({cfg}), FedFaaS only: ACT / pure ingest (gateway's first byte -> "
                f"sealed global, over first byte -> last update sealed) | "
                f"{rnd['act_over_ingest']:.2f} ({rnd['act_s']:.2f} / {rnd['ingest_s']:.2f} s) | | | <= 1.2 | {th} |"
            )
    th = _threads(r)
    rnd, peer = r.get("round"), r.get("round_userspace")
    if rnd and peer and rnd.get("ok") and peer.get("ok") and rnd["router"] != peer["router"]:
        rows.append(
            f"| round (default): e2e; last update sealed -> global sealed (s), {rnd['router']} "
            f"router vs {peer['router']} router | {rnd['e2e_s']:.2f}; {rnd['after_ingest_s']:.3f} | "
            f"{peer['router']} {peer['e2e_s']:.2f}; {peer['after_ingest_s']:.3f} | "
            f"{peer['e2e_s'] / rnd['e2e_s']:.2f}x; "
            f"{peer['after_ingest_s'] / rnd['after_ingest_s']:.2f}x | | {th} |"
        )
    rows += sweep_rows(r, peers)
    return rows


def sweep_rows(r: dict[str, Any], peers: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    """The memory sweep: the server's peak against clients per round, flat, and the largest
    round's against Flower's at the default round's size."""
    sweep = r.get("memory_sweep") or {}
    done = {int(n): x for n, x in sweep.items() if x and x.get("ok", True)}
    if not done:
        return []
    th = _threads(r)
    cells = "; ".join(
        f"{n}: {_gb(server_peak(x) or 0)}" if n in done else f"{n}: {_side(x, '')}"
        for n, x in sorted(((int(k), v) for k, v in sweep.items()), key=lambda kv: kv[0])
    )
    peaks = [server_peak(x) or 0.0 for x in done.values()]
    spread = max(peaks) / min(peaks) if min(peaks) else None
    flower = dict(peers).get("Flower")
    largest = done[max(done)]
    vs = ""
    if flower and flower.get("ok", True) and server_peak(flower):
        vs = (
            f"Flower at {flower.get('num_clients', '?')} clients {_gb(server_peak(flower) or 0)}: "
            f"{(server_peak(flower) or 0) / (server_peak(largest) or 1):.2f}x FedFaaS's at {max(done)}"
        )
    rows = [
        f"| memory sweep (default round settings, {largest['update_bytes'] / 1e6:.1f} MB "
        f"updates): server peak memory (GB, every page "
        f"once: the server cgroup's peak where measured) by clients per round | {cells} | {vs} | max/min "
        f"{'n/a' if spread is None else f'{spread:.2f}'} | within 10% (max/min <= 1.10); >= 10x "
        f"below Flower's at 20 | {th} |",
        "| memory sweep: the round at each size (s, server window) | "
        + "; ".join(f"{n}: {_side(x, 'server_s')}" for n, x in sorted(done.items()))
        + f" | | | | {th} |",
    ]
    return rows


def table(r: dict[str, Any]) -> str:
    from bench.harness.compare import compare_rows

    rows = [
        "| figure | FedFaaS | baseline(s) | ratio | target | threads |",
        "|---|---|---|---|---|---|",
        *compare_rows(r.get("compare") or {}),
        *(_part_rows(r) if "ingest" in r else []),
    ]
    return _table_head(r) + "\n\n" + "\n".join(rows)


def _part_rows(r: dict[str, Any]) -> list[str]:
    """The rows of the single-run parts: ingest, fold, round variants, sweep."""
    ing, agg = r["ingest"], r["aggregation"]
    mb = ing["update_bytes"] / 1e6
    th = _threads(r)
    return [
        f"| ingest {mb:.1f} MB over loopback HTTP into shm, pre-encoded body, raw-socket client "
        f"(GB/s, median of {ing['reps']}; best) | "
        f"{ing['fedfaas_gbps']:.2f}; {ing['fedfaas_best_gbps']:.2f} | raw TCP {ing['tcp_gbps']:.2f}; "
        f"uvicorn+Starlette {ing['starlette_gbps']:.2f} | {ing['fedfaas_gbps'] / ing['starlette_gbps']:.1f}x Starlette, "
        f"{ing['fedfaas_gbps'] / ing['tcp_gbps']:.0%} of TCP | >= 1.5 GB/s | {th} |",
        f"| FedAvg fold, 1 core (GB/s of update, {agg['updates']} updates in shm) | numpy/BLAS {agg['numpy_gbps']:.2f}; "
        f"torch add_ {agg['torch_gbps']:.2f} | plain-tensor add_ {agg['plain_add_gbps']:.2f}; Flower aggregate "
        f"{agg['flower_gbps']:.2f} | {agg['numpy_gbps'] / agg['flower_gbps']:.1f}x / "
        f"{agg['torch_gbps'] / agg['flower_gbps']:.1f}x Flower | >= 4 GB/s | {th} |",
        *round_rows(r),
    ]


def _first_run(r: dict[str, Any], system: str) -> dict[str, Any]:
    """The first finished run of ``system`` in the comparison ({} when none)."""
    for block in (r.get("compare") or {}).get("by_cpus", {}).values():
        for rec in block["runs"].get(system, []):
            if rec.get("ok", True):
                return dict(rec)
    return {}


def _table_head(r: dict[str, Any]) -> str:
    """The machine, the round's settings and the run record, above the table."""
    m = r["machine"]
    probe = r.get("router_probe") or {"mode": "userspace", "reason": "not recorded"}
    rnd = r.get("round") or _first_run(r, "FedFaaS")
    head = (
        f"Machine: {m['cores']} cores, {m['memory_bytes'] / 2**30:.1f} GiB, Python {m['python']} "
        f"(shared with other work: figures are ratios within one run); round updates = ResNet-18 "
        f"(10 classes) floating-point state dict, float32, {rnd.get('update_bytes', 0) / 1e6:.1f} MB, "
        f"serialised by each client inside the window (FedFaaS: safetensors, uploaded through "
        f"FLClient.upload; Flower: ndarrays_to_parameters and gRPC); aggregator kernel numpy/BLAS "
        f"saxpy; rounds aggregated by {rnd.get('aggregator_replicas', '?')} warm `aggregator` "
        f"replica(s) of {rnd.get('endpoints_per_replica', '?')} endpoint(s), granted the job by "
        f"the gateway; router probe: {probe['mode']} ({probe['reason']})."
    )
    sf = _sf(r) or _first_run(r, "SF")
    if sf and sf.get("ok", True):
        head += (
            f" SF round (HTTP between aggregators): {sf['leaves']} leaves (I={sf['fanout']}) on "
            f"{sf['leaf_servers']} uvicorn+Starlette leaf server processes and one top; clients "
            f"POST safetensors to their leaf, leaves fold with the same numpy/BLAS kernel and "
            f"POST their raw float32 partial to the top, which divides, encodes and serves the "
            f"global model."
        )
    run = r.get("run")
    if run:
        head += "\n\n" + run_header(run)
    return head


def render(stored: dict[str, Any]) -> str:
    return "# bench: dataplane\n\n" + table(stored) + "\n"


def _colour(label: str) -> str:
    """Flower red, SF orange, FedFaaS green (eBPF router) or cyan (userspace router)."""
    if label.startswith("Flower"):
        return "tab:red"
    if label.startswith("SF"):
        return "tab:orange"
    return "tab:cyan" if "userspace" in label else "tab:green"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "ingest" not in r:  # a comparison alone (--compare-only): its table is the figure
        return
    fig, ax = plt.subplots(1, 5, figsize=(22, 4))
    ing = r["ingest"]
    ax[0].bar(
        ["FedFaaS", "raw TCP", "uvicorn+Starlette"],
        [ing["fedfaas_gbps"], ing["tcp_gbps"], ing["starlette_gbps"]],
        color=["tab:green", "tab:gray", "tab:red"],
    )
    ax[0].axhline(1.5, ls="--", c="k", lw=1)
    ax[0].set_title(f"ingest {ing['update_bytes'] / 1e6:.1f} MB update (GB/s)")
    agg = r["aggregation"]
    ax[1].bar(
        ["numpy/BLAS", "torch", "plain add_", "Flower"],
        [agg["numpy_gbps"], agg["torch_gbps"], agg["plain_add_gbps"], agg["flower_gbps"]],
        color=["tab:green", "tab:green", "tab:gray", "tab:red"],
    )
    ax[1].axhline(4, ls="--", c="k", lw=1)
    ax[1].set_title("FedAvg fold, 1 core (GB/s)")
    labels, e2e, server, mem = [], [], [], []
    sides = [(f"{lab}\n{(r.get(k) or {}).get('router', '')}", r.get(k)) for k, lab in ROUNDS]
    for lab, x in [*sides, *_baselines(r)]:
        if not x or not x.get("ok", True):
            continue
        labels.append(lab)
        e2e.append(x["e2e_s"])
        server.append(x.get("server_s") or 0.0)
        mem.append((server_peak(x) or 0.0) / 1e9)
    xs = np.arange(len(labels))
    cols = [_colour(lab) for lab in labels]
    ax[2].bar(xs - 0.2, e2e, 0.4, color=cols, label="weights in memory -> global")
    ax[2].bar(xs + 0.2, server, 0.4, color=cols, alpha=0.5, hatch="//", label="server window")
    ax[2].set_xticks(xs, labels, fontsize=7)
    ax[2].legend(fontsize=7)
    ax[2].set_title("round (s): end to end; server-side only")
    ax[3].bar(labels, mem, color=cols)
    ax[3].set_title("server peak memory, every page once (GB)")
    ax[3].tick_params(axis="x", labelsize=7)
    sweep = {int(n): x for n, x in (r.get("memory_sweep") or {}).items() if x and x.get("ok")}
    if sweep:
        ns = sorted(sweep)
        ax[4].plot(ns, [(server_peak(sweep[n]) or 0) / 1e9 for n in ns], "o-", c="tab:green")
        ax[4].set_ylim(bottom=0)
        ax[4].set_xlabel("clients per round")
        flower = r.get("flower")
        if flower and flower.get("ok", True) and server_peak(flower):
            ax[4].axhline(
                (server_peak(flower) or 0) / 1e9, ls="--", c="tab:red", label="Flower, 20"
            )
            ax[4].legend(fontsize=7)
    ax[4].set_title("FedFaaS server peak memory by clients (GB)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
