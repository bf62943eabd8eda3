"""The eBPF benchmark's report: the Markdown rendered from the result JSON and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.runinfo import run_header

if TYPE_CHECKING:
    pass


#: the systems, in the order of the tables and the plot
METHODS = ("ebpf", "ebpf_file", "userspace", "sf", "sl")


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if v >= 1000:
        return f"{v:,.0f}{unit}"
    return f"{v:.1f}{unit}" if v >= 10 else f"{v:.2f}{unit}"


def markdown(report: dict[str, Any]) -> str:
    """The Markdown report, rendered from the result JSON (``write_result`` reads it back)."""
    bulk = "; ".join(
        f"{method.upper()} handoffs " + "/".join(str(v) for v in per.values())
        for method, per in report["config"]["bulk_handoffs"].items()
    )
    lines = [
        "# Leaf -> top handoff of one update, one node",
        "",
        run_header(report["run"]),
        "",
        f"Key handoffs: {report['config']['key_handoffs']} per size; {bulk}. "
        "Latency: leaf send -> top holds a usable view of the update. eBPF/userspace: the key "
        "is delivered (frame received: 'key' columns) and the top opens the object as the "
        "aggregator does ('open' columns: StoreClient.open, header check, the worker's _flat "
        "view; ebpf and userspace read the job's arena, mapped once at the grant; ebpf_file "
        "opens a plain-file object with mmap and MAP_POPULATE per handoff, the path before the "
        "arena); the handoff is both. Touch: one value read from every page of the update, at "
        "the first handoff after the grant (minor faults of the lazily mapped arena, once per "
        "slot and grant) and at the last. SF/SL: all bytes received. CPU: "
        "user+system time of all processes on the path (leaf, top, gateway or proxy+Redis), "
        "per handoff, including the acknowledgement that paces the next one. Ratios compare "
        "the whole handoff (eBPF's key + open). threads: the most threads any BLAS/OpenMP pool "
        "of the receiving process used (none: no pool loaded).",
        "",
        "| model | MB | method | handoff median us | p99 us | key median us | key p99 us "
        "| open median us | open p99 us | touch first / last us | CPU us/handoff "
        "| latency x eBPF | CPU x eBPF | threads |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, res in report["results"].items():
        for method in METHODS:
            r = res[method]
            if r.get("unavailable"):
                lines.append(
                    f"| {model} | {res['bytes'] / 1e6:.1f} | {method} | unavailable: "
                    f"{r['unavailable']} | | | | | | | | | | |"
                )
                continue
            rat = report["ratios"][model]
            lat_x = 1.0 if method == "ebpf" else rat[f"{method}_over_ebpf_latency"]
            cpu_x = 1.0 if method == "ebpf" else rat[f"{method}_over_ebpf_cpu"]
            touch = (
                f"{_fmt(r['first_touch_us'])} / {_fmt(r.get('last_touch_us'))}"
                if r.get("first_touch_us") is not None
                else ""
            )
            lines.append(
                f"| {model} | {res['bytes'] / 1e6:.1f} | {method} | {_fmt(r['median_us'])} | "
                f"{_fmt(r['p99_us'])} | {_fmt(r.get('key_median_us'))} | "
                f"{_fmt(r.get('key_p99_us'))} | "
                f"{_fmt(r.get('open_median_us'))} | {_fmt(r.get('open_p99_us'))} | {touch} | "
                f"{_fmt(r['cpu_us_per_handoff'])} | {_fmt(lat_x, 'x')} | {_fmt(cpu_x, 'x')} | "
                f"{r.get('top_threads') if r.get('top_threads') is not None else 'none'} |"
            )
    t = report["targets"]
    lines += [
        "",
        "Targets: eBPF key delivery median <= 20 us: **{}** (<= 50 us: {}); p99 <= 100 us: "
        "**{}**; key delivery flat in size (max/min median {}); the receiver maps the arena "
        "once per grant, never per handoff: **{}**; the open's growth with the model (max/min "
        "median {}); SF >= 100x eBPF (whole handoff) for ResNet-152: **{}**; eBPF CPU < "
        "userspace CPU: **{}**.".format(
            t.get("ebpf_key_median_le_20us"),
            t["ebpf_key_median_le_50us"],
            t.get("ebpf_key_p99_le_100us"),
            _fmt(t["ebpf_key_flat_max_over_min"]),
            t.get("ebpf_one_mapping_per_grant"),
            _fmt(t["ebpf_open_max_over_min"]),
            t["sf_over_ebpf_resnet152_ge_100"],
            t["ebpf_cpu_lt_userspace"],
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["results"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.16
    for ax, metric, title in (
        (axes[0], "median_us", "median handoff latency (us, log)"),
        (axes[1], "cpu_us_per_handoff", "CPU per handoff (us, log)"),
    ):
        for i, method in enumerate(METHODS):
            vals = [report["results"][m][method].get(metric) or 0 for m in models]
            off = (i - (len(METHODS) - 1) / 2) * width
            ax.bar([x + off for x in range(len(models))], vals, width, label=method)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels([f"{m}\n{report['results'][m]['bytes'] / 1e6:.0f} MB" for m in models])
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
