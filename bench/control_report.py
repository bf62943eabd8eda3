"""bench-control's report: the Markdown rendered from the result JSON and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.lifl_sim import FIG8_VARIANTS
from bench.runinfo import run_header

if TYPE_CHECKING:
    pass
from bench.control_real import REAL_LADDER


def verdict(median_ms: float, target_ms: float) -> str:
    """``meets <= T ms`` or ``MISSES <= T ms`` for a whole measured figure against its target."""
    return f"{'meets' if median_ms <= target_ms else 'MISSES'} <= {target_ms:g} ms"


def vs_paper(median_ms: float, paper_ms: float) -> str:
    """``N.Nx faster than P ms`` or ``N.Nx SLOWER than P ms``."""
    if median_ms <= paper_ms:
        return f"{paper_ms / median_ms:.1f}x faster than {paper_ms:g} ms"
    return f"{median_ms / paper_ms:.1f}x SLOWER than {paper_ms:g} ms"


def to_markdown(r: dict[str, Any]) -> str:
    """The Markdown report, rendered from the result JSON (``write_result`` reads it back)."""
    t_place, t_replan = r["targets"]["placement_ms"], r["targets"]["replan_ms"]
    p_place, p_replan = r["paper"]["placement_ms"], r["paper"]["replan_ms"]
    lines = [
        "# Control-plane benchmark",
        "",
        run_header(r["run"]),
        "",
        f"Placement: {r['placement']['clients']} clients on {r['placement']['nodes']} nodes.",
        "",
        "## (a) Placement of 10,000 clients and (b) re-plan",
        "",
        "Verdicts use the median of the whole operation (a re-plan is every node's EWMA update, "
        "the re-plan and the diff, for all the nodes: never divided per node); p99 on a shared "
        "machine includes preemption by other work. threads: the most threads any BLAS/OpenMP "
        "pool of the process used during the row.",
        "",
        "| case | median ms | p99 ms | threads | vs paper | vs target |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, v in r["placement"].items():
        if isinstance(v, dict):
            lines.append(
                f"| place {k} | {v['median_ms']:.3f} | {v['p99_ms']:.3f} | {v['threads']} | "
                f"{vs_paper(v['median_ms'], p_place)} | "
                f"{verdict(v['median_ms'], t_place)} |"
            )
    for k, v in r["replan"].items():
        t = v["replan_and_diff"]
        lines.append(
            f"| whole re-plan + diff, {k} | {t['median_ms']:.4f} | {t['p99_ms']:.4f} | "
            f"{t['threads']} | {vs_paper(t['median_ms'], p_replan)} | "
            f"{verdict(t['median_ms'], t_replan)} |"
        )
        e = v["ewma_estimate"]
        lines.append(
            f"| its EWMA update alone, {k} | {e['median_ms']:.4f} | {e['p99_ms']:.4f} | "
            f"{e['threads']} | (part of the row above) | (no target of its own) |"
        )
    base = r["placement"]["bestfit_one_job_item_by_item"]["median_ms"]
    fast = r["placement"]["bestfit_one_job"]["median_ms"]
    lines += [
        "",
        f"Vectorised BestFit vs the item-by-item loop of the same policy: {base / fast:.1f}x.",
        "",
    ]
    rp = r.get("round_planning")
    if rp:
        t = rp["timing"]
        lines += [
            f"## (d) One round of {rp['selected']:,} clients selected from {rp['enrolled']:,} "
            "enrolled",
            "",
            f"Selection, placement on {rp['nodes']} nodes, the hierarchy's plan "
            f"({rp['slots']} slots) and the slot table the gateways get: what opening a round "
            "computes before it calls them (`Coordinator.plan_round`).",
            "",
            "| case | median ms | p99 ms | threads | vs target |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| plan one round | {t['median_ms']:.3f} | {t['p99_ms']:.3f} | {t['threads']} | "
            f"{verdict(t['median_ms'], rp['target_ms'])} |",
            "",
        ]
    c = r["fig8"]["costs"]
    lines += [
        "## (c) Fig. 8 ladder: five nodes, MC = 20 (MODEL with measured costs)",
        "",
        f"**This part is a model, not an end-to-end run** ({r['fig8']['real_stack']}). "
        f"Model: {r['fig8']['model']} ({r['fig8']['model_bytes'] / 1e6:.1f} MB); updates arrive "
        f"uniformly over {r['fig8']['window_s']} s; mean over {r['fig8']['seeds']} seeds.",
        f"Measured costs: aggregate one update {c['agg_s'] * 1e3:.2f} ms; replica cold start "
        f"{c['cold_s']:.2f} s wall / {c['cold_cpu_s']:.2f} s CPU (load of the aggregator's "
        f"handler by the watchdog; imports torch: "
        f"{r['fig8']['cost_sources']['cold_start_imports_torch']}); inter-node transfer "
        f"{c['xfer_s'] * 1e3:.1f} ms wall / {c['xfer_cpu_s'] * 1e3:.1f} ms CPU; key handoff "
        f"{c['key_s'] * 1e6:.1f} us.",
        "",
        "| updates | variant | ACT s | ACT vs SL-H | CPU s | CPU vs SL-H | aggregators created | nodes used | cross-node |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    header = lines[-2:]
    for key in ("results", "results_paper_network"):
        if key == "results_paper_network":
            lines += [
                "",
                "Same model, inter-node hop as slow as the paper's testbed "
                f"(232 MB in 4.2 s, so {r['fig8']['paper_network_xfer_s']:.2f} s for this model):",
                "",
                *header,
            ]
        for n, rows in r["fig8"][key].items():
            for name, x in rows.items():
                if "act_vs_baseline" not in x:
                    lines.append(f"| {n} | {name} | failed: {x.get('error', 'no baseline')} |")
                    continue
                lines.append(
                    f"| {n} | {name} | {x['act_s']:.3f} | {x['act_vs_baseline']:.2f} | "
                    f"{x['cpu_s']:.2f} | {x['cpu_vs_baseline']:.2f} | {x['aggregators_created']} | "
                    f"{x['nodes_used']} | {x['cross_node_transfers']} |"
                )
    real = r.get("fig8_real", {})
    lines += ["", "## (c') Fig. 8 on real node gateways (placement and eager/lazy)", ""]
    if not real.get("ran"):
        lines.append(f"Not run: {real.get('why')}.")
    else:
        lines += [
            f"Five `python -m gateway` processes on this machine ({real['setup']}), one shared Redis; "
            f"the coordinator places the round and creates the job on the nodes it uses (on all "
            "five when it pushes its plan); "
            f"{real['model']}; all updates uploaded at once (16 in flight). ACT = first upload "
            "to model published. CPU = gateways + aggregator replicas. The first two rows run the "
            "gateways' static plan; from +planning on the coordinator pushes its plan (PUT "
            ".../plan). Reuse is not a switch on real gateways: the aggregator replicas are warm "
            "endpoints that the gateways grant any slot (the +reuse row exists only in the model above).",
            "",
            "| updates | variant | ACT s | ACT vs SL-H | after last upload s | CPU s | CPU vs SL-H | aggregator tasks | nodes used |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for n, rows in real["results"].items():
            for name, x in rows.items():
                if "act_vs_baseline" not in x:
                    lines.append(f"| {n} | {name} | failed: {x.get('error', 'no baseline')} |")
                    continue
                lines.append(
                    f"| {n} | {name} | {x['act_s']:.3f} | {x['act_vs_baseline']:.2f} | "
                    f"{x['after_last_upload_s']:.3f} | {x['cpu_s']:.2f} | "
                    f"{x['cpu_vs_baseline']:.2f} | {x['aggregator_tasks']} | {x['nodes_used']} |"
                )
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = r.get("fig8_real", {})
    panels = [
        (r["fig8"]["results"], "model, loopback hop", "aggregators_created"),
        (r["fig8"]["results_paper_network"], "model, paper-speed hop", "aggregators_created"),
    ]
    if real.get("ran"):
        panels.append((real["results"], "REAL gateways", "aggregator_tasks"))
    fig, grid = plt.subplots(len(panels), 4, figsize=(18, 4 * len(panels)), squeeze=False)
    for axes, (res, label, count_key) in zip(grid, panels, strict=True):
        ns = sorted(res, key=int)
        ladder = [v.name for v in FIG8_VARIANTS] + [x[0] for x in REAL_LADDER]
        names = sorted(res[ns[0]], key=lambda k: ladder.index(k) if k in ladder else len(ladder))
        for ax, key, title in zip(
            axes,
            ("act_s", "cpu_s", count_key, "nodes_used"),
            ("ACT (s)", "CPU time (s)", count_key.replace("_", " "), "nodes used"),
            strict=True,
        ):
            width = 0.8 / len(names)
            for i, name in enumerate(names):
                vals = [res[n][name].get(key) or 0 for n in ns]
                ax.bar(np.arange(len(ns)) + i * width, vals, width, label=name)
            ax.set_xticks(np.arange(len(ns)) + 0.4 - width / 2, ns)
            ax.set_xlabel("concurrent updates")
            ax.set_title(f"{title}, {label}")
        axes[0].legend(fontsize=7)
    fig.suptitle(
        "LIFL Fig. 8 ladder on this machine: model rows driven by measured costs, real row"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
