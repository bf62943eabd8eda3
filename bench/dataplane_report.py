"""The report of ``bench.dataplane``: its table and plot, rendered from its JSON as written.

:func:`table` puts the same-CPUs comparison first (:func:`bench.harness.compare.compare_rows`),
then the micro-benchmarks (ingest, fold) and the round variants (:func:`variant_rows`: FedFaaS's
settings compared with its default round, each a median [min-max] over repeated, alternating
runs). :func:`render` is the Markdown file, :func:`plot` the figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.compare import SERVER_COLUMNS, spread
from bench.runinfo import run_header

#: the variants' settings as the table says them (bench.dataplane.variants runs them)
VARIANTS = {
    "FedFaaS": "default: I=2, 4 uploads at once, the eBPF router where it loads",
    "FedFaaS, userspace router": "default settings, the userspace router",
    "FedFaaS, lean": "I=4, 1 upload at once",
    "FedFaaS, one core": "default, the top and the publication on one thread each",
}

#: the variants' columns: label, the run record's key, scale
VARIANT_COLUMNS = (
    *SERVER_COLUMNS,
    ("tail s: last update sealed -> global published", "last_update_to_published_s", 1.0),
    ("ACT / pure ingest", "act_over_ingest", 1.0),
)


def _threads(r: dict[str, Any]) -> str:
    th = r.get("threads") or {}
    env = th.get("env") or {}
    pools = ", ".join(f"{p['library']} {p['threads']}" for p in th.get("pools") or [])
    return f"env {'/'.join(sorted(set(env.values()))) or '?'} in every process; bench {pools}"


def _figure(rec: Mapping[str, Any], key: str) -> float | None:
    """A run's figure: the cgroup's for the server's peak and CPU-seconds, else the record's."""
    server = (rec.get("cgroup") or {}).get("server") or {}
    if key == "server_peak_bytes":
        return server.get("peak_bytes")
    if key == "server_cpu_s":
        return server.get("cpu_s")
    return rec.get(key)


def _cell(s: Mapping[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not s:
        return "—"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'] / scale)} [{f.format(s['min'] / scale)}-{f.format(s['max'] / scale)}]"


def variant_rows(variants: Mapping[str, Any]) -> list[str]:
    """One row per variant: each column's median [min-max] over its finished runs, and the
    variant's round and server window over the default's (ratios of medians)."""
    if not variants:
        return []
    [(cpus, block)] = variants["by_cpus"].items()
    runs, ratios = block["runs"], block["summary"]["ratios"]
    cols = " | ".join(c for c, _, _ in VARIANT_COLUMNS)
    rows = [
        f"Round variants, FedFaaS alone, on CPUs {cpus}: {variants['repeats']} runs each, "
        f"{variants['order']}; median [min-max] over the runs that finished, ratios of medians.",
        "",
        f"| variant | settings | runs finished | {cols} | round; server window over the default's |",
        "|---|---|---|" + "---|" * len(VARIANT_COLUMNS) + "---|",
    ]
    for name, recs in runs.items():
        done = [r for r in recs if r.get("ok", True)]
        cells = " | ".join(
            _cell(spread([_figure(r, key) for r in done]), scale, 3 if "tail" in label else 2)
            for label, key, scale in VARIANT_COLUMNS
        )
        r = ratios.get(name) or {}
        vs = (
            "; ".join("—" if r.get(k) is None else f"{r[k]:.2f}x" for k in ("e2e_s", "server_s"))
            if r
            else ""
        )
        routers = sorted({str(x.get("router")) for x in done}) or ["?"]
        rows.append(
            f"| {name} | {VARIANTS.get(name, '')} ({'/'.join(routers)} router) | "
            f"{len(done)}/{len(recs)} | {cells} | {vs} |"
        )
    return rows


def table(r: dict[str, Any]) -> str:
    from bench.harness.compare import compare_rows

    rows = [
        "| figure | FedFaaS | baseline(s) | ratio | target | threads |",
        "|---|---|---|---|---|---|",
        *compare_rows(r.get("compare") or {}),
        *(_part_rows(r) if "ingest" in r else []),
    ]
    out = _table_head(r) + "\n\n" + "\n".join(rows)
    if r.get("variants"):
        out += "\n\n" + "\n".join(variant_rows(r["variants"]))
    return out


def _part_rows(r: dict[str, Any]) -> list[str]:
    """The micro-benchmarks' rows: ingest and fold."""
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
    rnd = _first_run(r, "FedFaaS")
    sent = (  # records before the streamed upload have no "upload": their clients made bytes
        "written by FLClient.upload as it sends them"
        if rnd.get("upload") == "stream"
        else "made first, then uploaded through FLClient.upload"
    )
    head = (
        f"Machine: {m['cores']} cores, {m['memory_bytes'] / 2**30:.1f} GiB, Python {m['python']} "
        f"(shared with other work: figures are ratios within one run); round updates = ResNet-18 "
        f"(10 classes) floating-point state dict, float32, {rnd.get('update_bytes', 0) / 1e6:.1f} MB, "
        f"serialised by each client inside the window (FedFaaS: safetensors, {sent}; Flower: "
        f"its ArrayRecord, pushed to the SuperLink); aggregator kernel "
        f"numpy/BLAS saxpy; rounds aggregated by {rnd.get('aggregator_replicas', '?')} warm "
        f"`aggregator` replica(s) of {rnd.get('endpoints_per_replica', '?')} endpoint(s), granted "
        f"the job by the gateway; router probe: {probe['mode']} ({probe['reason']})."
    )
    sf = _first_run(r, "SF")
    if sf:
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
    """Flower red, SF orange, FedFaaS green (its userspace-router variant cyan)."""
    if label.startswith("Flower"):
        return "tab:red"
    if label.startswith("SF"):
        return "tab:orange"
    return "tab:cyan" if "userspace" in label else "tab:green"


def _medians(cmp: Mapping[str, Any], key: str) -> tuple[list[str], list[float], list[list[float]]]:
    """Each system's (or variant's) median of ``key`` in the comparison's first CPU set, with
    its distance to the min and the max (for error bars)."""
    labels: list[str] = []
    med: list[float] = []
    err: list[list[float]] = [[], []]
    for block in list((cmp.get("by_cpus") or {}).values())[:1]:
        for name, recs in block["runs"].items():
            s = spread([_figure(x, key) for x in recs if x.get("ok", True)])
            if not s:
                continue
            labels.append(name)
            med.append(s["median"])
            err[0].append(s["median"] - s["min"])
            err[1].append(s["max"] - s["median"])
    return labels, med, err


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "ingest" not in r:  # a comparison alone (--compare-only): its table is the figure
        return
    fig, ax = plt.subplots(1, 5, figsize=(24, 4))
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
    cmp = r.get("compare") or {}
    panels = (
        (ax[2], cmp, "e2e_s", 1.0, "round (s), median [min-max], first CPU set"),
        (ax[3], cmp, "server_peak_bytes", 1e9, "server peak memory, cgroup (GB)"),
        (ax[4], r.get("variants") or {}, "e2e_s", 1.0, "FedFaaS round variants (s)"),
    )
    for a, block, key, scale, title in panels:
        labels, med, err = _medians(block, key)
        xs = np.arange(len(labels))
        a.bar(xs, np.array(med) / scale, yerr=np.array(err) / scale, capsize=4,
              color=[_colour(x) for x in labels])  # fmt: skip
        a.set_xticks(xs, [x.replace(", ", "\n") for x in labels], fontsize=7)
        a.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
