"""bench-flstore section: the tables of the rounds of 120 and 200 ResNet-18-sized updates
(:mod:`bench.flstore_rounds` runs them): latency per system, memory against the budget, where
FedFaaS's time went; each size, and each system of a size, naming the run it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.flstore_rounds import PROFILE_COLUMNS, SYSTEMS, WORKLOADS
from bench.runinfo import run_header


def section_run(
    section: dict[str, Any], what: str = "This section is from its own run"
) -> list[str]:
    """The line naming the run of a section (or of ``what``) stored from another run than the
    result's own (its ``run`` block: when it started, at which commit), or none."""
    run = section.get("run")
    if not isinstance(run, dict):
        return []
    commit = run.get("commit") or {}
    sha = str(commit.get("sha") or "unknown")[:12]
    dirty = " with uncommitted changes" if commit.get("dirty") else ""
    return [
        f"{what}: `{run.get('command', '')}`, started {run.get('started')}, commit {sha}{dirty}.",
        "",
    ]


def _spread(q: dict[str, Any]) -> str:
    """A query's median latency and, over several askings, their range: ``12.3 (11.9-13.0)``."""
    lat = q.get("latencies_s") or [q["latency_s"]]
    med = f"{q['latency_s']:.1f}"
    failed = " failed" if "error" in q else ""
    return med + failed if len(lat) < 2 else f"{med} ({min(lat):.1f}-{max(lat):.1f}){failed}"


#: the systems as the table names them
SYSTEM_NAMES = {"fedfaas": "FedFaaS", "objstore-agg": "ObjStore-Agg", "cache-agg": "Cache-Agg"}


def _run_line(run: dict[str, Any]) -> str:
    commit = run.get("commit") or {}
    sha = str(commit.get("sha") or "unknown")[:12]
    dirty = " with uncommitted changes" if commit.get("dirty") else ""
    return f"`{run.get('command', '')}`, started {run.get('started')}, commit {sha}{dirty}"


def size_runs(n: str, row: dict[str, Any]) -> list[str]:
    """The line naming the run of a size's rows, or, where its systems came from several runs
    (``runs``: the run of each, :mod:`bench.flstore_merge`), each system's run."""
    runs = row.get("runs")
    if (
        not isinstance(runs, dict)
        or len({json.dumps(r, sort_keys=True) for r in runs.values()}) < 2
    ):
        return section_run(row, f"The rows of {n} updates are from their own run")
    groups: dict[str, list[str]] = {}
    for system in SYSTEMS:
        if isinstance(runs.get(system), dict):
            groups.setdefault(json.dumps(runs[system], sort_keys=True), []).append(system)
    parts = [
        " and ".join(SYSTEM_NAMES[x] for x in names) + " from " + _run_line(json.loads(run))
        for run, names in groups.items()
    ]
    return [f"At {n} updates, " + "; ".join(parts) + ".", ""]


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, one_run: bool = True) -> str:
    """``a``'s latency over ``b``'s; none where either is missing, or where the two come from
    different runs (another sitting of the machine, another load: not one comparison)."""
    if not (a and b):
        return ""
    return f"{a['latency_s'] / b['latency_s']:.2f}x" if one_run else "other runs"


def _one_run(row: dict[str, Any], x: str, y: str) -> bool:
    """Whether systems ``x`` and ``y`` of a size's row come from one run."""
    runs = row.get("runs")
    if not isinstance(runs, dict):
        return True
    return json.dumps(runs.get(x), sort_keys=True) == json.dumps(runs.get(y), sort_keys=True)


def _queries(row: dict[str, Any], system: str) -> dict[str, Any]:
    return dict((row.get(system) or {}).get("queries") or {})


def _not_run(row: dict[str, Any], system: str) -> str:
    asked = row.get("systems")
    if asked is not None and system not in asked:
        return "not asked in this run"
    if system == "cache-agg" and row.get("cache_agg_not_asked"):
        return "not asked in this run"
    return "not run"


def _rtol(big: dict[str, Any]) -> str:
    tols = {
        float(row["reference"]["rtol"])
        for row in big["sizes"].values()
        if (row.get("reference") or {}).get("rtol") is not None
    }
    return ", ".join(f"{t:g}" for t in sorted(tols)) or "(none run)"


def reference_cell(row: dict[str, Any], wl: str) -> str:
    """Each system's answer to ``wl`` against the reference: ``F equal`` or ``F differs in
    <keys>`` (``no answer``), or why there is no comparison."""
    ref = ((row.get("reference") or {}).get("workloads") or {}).get(wl)
    if ref is None:
        return "not compared"
    if not ref.get("checked"):
        return f"no reference ({ref['error']})" if ref.get("error") else "no reference"
    cells = []
    for system, short in zip(SYSTEMS, "FOC", strict=True):
        got = ref.get(system)
        if got is None:
            continue
        if got == []:
            cells.append(f"{short} equal")
        elif isinstance(got, list):
            cells.append(f"{short} differs in {', '.join(got)}")
        else:
            cells.append(f"{short} {got}")
    return "; ".join(cells) or "no answer asked"


def markdown(big: dict[str, Any]) -> list[str]:
    """The section's table."""
    gb = big["budget_bytes"] / 1e9
    lines = [
        "## Rounds of 120 and 200 ResNet-18-sized updates",
        "",
        *section_run(big),
        *(line for n, row in big["sizes"].items() for line in size_runs(n, row)),
        f"Node memory budget {gb:.1f} GB. Each update 44.7 MB (ResNet-18's 11,181,642 "
        "float32; the leading 650 a digits classifier the clients trained, the evaluator of "
        "leave-one-out and Shapley). Each size on a fresh `fedfaas up --with all`, one system "
        "at a time; 'same answer': FedFaaS's "
        "answer equals ObjStore-Agg's (the in-process computation on the whole vectors); '= "
        "Cache-Agg's': and Cache-Agg's (compared within the run that asked both). "
        f"GTG-Shapley with `{json.dumps(big['gtg_params'])}`. Each query asked "
        f"{big.get('repeats', 1)} times of each system in a row (GTG-Shapley "
        f"{big.get('gtg_repeats', 1)}), memos across queries "
        f"{big.get('memos', 'on')}: the median latency in seconds, the range of the askings "
        "in brackets; 'vs': the medians' ratio (within one run only). '= reference': each "
        "system's answer (F FedFaaS, O ObjStore-Agg, C Cache-Agg) against the independent "
        "reference (`bench/flstore_reference.py`, float64, columns streamed from MinIO) on "
        "the keys it computes, relative tolerance "
        f"{_rtol(big)}; GTG-Shapley's values are Monte Carlo: only its v_empty and v_full.",
        "",
        "| updates | workload | FedFaaS s | ObjStore-Agg s | Cache-Agg s | vs ObjStore | "
        "vs Cache | same answer | = Cache-Agg's | = reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, row in big["sizes"].items():
        asked = {x: _queries(row, x) for x in SYSTEMS}
        same = row.get("same_answer") or {}
        same_cache = row.get("same_answer_cache_agg") or {}
        for wl in WORKLOADS:
            f, o, c = (asked[x].get(wl) for x in SYSTEMS)
            if not (f or o or c):
                continue
            cells = [
                _spread(q) if q else _not_run(row, x)
                for x, q in zip(SYSTEMS, (f, o, c), strict=True)
            ]
            vs_o = _ratio(f, o, _one_run(row, "fedfaas", "objstore-agg"))
            vs_c = _ratio(f, c, _one_run(row, "fedfaas", "cache-agg"))
            lines.append(
                f"| {n} | {wl} | {' | '.join(cells)} | {vs_o} | {vs_c} | "
                f"{same.get(wl, 'not compared')} | {same_cache.get(wl, 'not compared')} | "
                f"{reference_cell(row, wl)} |"
            )
    lines.append("")
    if any(row.get("fedfaas") for row in big["sizes"].values()):
        lines += [
            "| updates | round GB | budget GB | cache functions' peak private GB | "
            "engine's peak account GB | queries in parts | partly from MinIO | wholly from "
            "MinIO | ingest + prefetch s | Cache-Agg | tracebacks in the engine's log |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for n, row in big["sizes"].items():
        f = row["fedfaas"]
        if not f:
            continue
        skipped = row["cache_agg_skipped_need_bytes"]
        cache_agg = (
            "run"
            if row.get("cache-agg")
            else f"not run (needs {skipped / 1e9:.0f} GB free)"
            if skipped
            else _not_run(row, "cache-agg")
        )
        lines.append(
            f"| {n} | {row['round_bytes'] / 1e9:.1f} | {gb:.1f} | "
            f"{f['memory']['peak_private_bytes'] / 1e9:.2f} | "
            f"{f['memory']['peak_accounted_bytes'] / 1e9:.2f} | "
            f"{f['stats']['queries_in_parts']} | {f['stats'].get('queries_partly_streamed', 0)} | "
            f"{f['stats']['queries_streamed']} | "
            f"{f['ingest_and_prefetch_s']:.0f} | "
            f"{cache_agg} | "
            f"{f.get('engine_log_tracebacks', '')} |"
        )
    lines += ["", *_profile_table(big)]
    lines += [line for n, row in big["sizes"].items() for line in _group_lines(n, row, gb)]
    for n, row in big["sizes"].items():
        mem = (row["fedfaas"] or {}).get("memory") or {}
        if "held_at_peak_bytes" in mem:
            held = sum(mem["held_at_peak_bytes"].values())
            lines += [
                f"At {n} updates the cache functions' private memory peaked during "
                f"{mem.get('peak_during') or 'the run'}, when they held {held / 1e9:.2f} GB of "
                "objects (the engine's table); the rest was their interpreters and the "
                "queries' working memory. Each function's own peak, GB: "
                + ", ".join(
                    f"{k} {v / 1e9:.2f}" for k, v in sorted(mem["peaks_by_function"].items())
                )
                + ".",
                "",
            ]
    return lines


def _profile_table(big: dict[str, Any]) -> list[str]:
    """Where FedFaaS's time went, per query: the cache functions' profiles summed over the
    functions, per asking (none for rows measured before the profile existed)."""
    rows = []
    for n, row in big["sizes"].items():
        for wl, q in _queries(row, "fedfaas").items():
            prof = q.get("profile")
            if prof is None:
                continue
            askings = max(1, len(q.get("latencies_s") or [0]))
            total = {
                k: sum(f.get(k, 0.0) for f in prof.values()) / askings for k, _ in PROFILE_COLUMNS
            }
            streaming = sum(1 for f in prof.values() if f.get("streamed_bytes"))
            cells = [
                f"{total[k] / 1e9:.2f}"
                if k == "streamed_bytes"
                else f"{total[k]:.0f}"
                if k == "streamed_requests"
                else f"{total[k]:.1f}"
                for k, _ in PROFILE_COLUMNS
            ]
            rows.append(
                f"| {n} | {wl} | {q['latency_s']:.1f} | {' | '.join(cells)} | {len(prof)} | "
                f"{streaming} |"
            )
    if not rows:
        return []
    return [
        "Where FedFaaS's time went: each cache function's profile (its `/ping`), summed over "
        "the functions and divided by the askings; the functions work at once on 2 cores, so "
        "their seconds add up past the latency.",
        "",
        "| updates | workload | latency s | "
        + " | ".join(name for _, name in PROFILE_COLUMNS)
        + " | functions | streaming |",
        "|---|---|---|" + "---|" * (len(PROFILE_COLUMNS) + 2),
        *rows,
        "",
    ]


def _group_lines(n: str, row: dict[str, Any], budget_gb: float) -> list[str]:
    """The platform's memory as its cgroup counted it (:mod:`bench.flstore_rounds_memory`),
    where the size's run measured it."""
    group = (((row.get("fedfaas") or {}).get("memory") or {}).get("platform_group")) or {}
    if not group:
        return []
    rest, peak = group["at_rest_bytes"] / 1e9, group["peak_bytes"] / 1e9
    return [
        f"At {n} updates the whole platform (MinIO, Redis, the runtime and its cache functions, "
        "the gateways, the engine, the tracker) ran in a cgroup of its own; its anonymous and "
        f"tmpfs memory (`{group['measure']}`, page cache left out) was {rest:.2f} GB before the "
        f"round was ingested and peaked at {peak:.2f} GB during "
        f"{group.get('peak_during') or 'the run'}: {peak - rest:.2f} GB above rest, against "
        f"the node's budget of {budget_gb:.1f} GB.",
        "",
    ]


def document(res: dict[str, Any]) -> str:
    """``flstore_rounds.md``: the run, then the section's tables."""
    lines = ["# FLStore: rounds of 120 and 200 ResNet-18-sized updates", ""]
    if isinstance(res.get("run"), dict):
        lines += [run_header(res["run"]), ""]
    lines += markdown(res["big_rounds"])
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    """``flstore_rounds.png``: each size's median latency per workload and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sizes = res["big_rounds"]["sizes"]
    fig, axes = plt.subplots(1, max(1, len(sizes)), figsize=(6.5 * max(1, len(sizes)), 4.5))
    for ax, (n, row) in zip(np.atleast_1d(axes), sizes.items(), strict=False):
        x = np.arange(len(WORKLOADS))
        for i, system in enumerate(SYSTEMS):
            q = _queries(row, system)
            ax.bar(
                x + (i - 1) * 0.27,
                [q[w]["latency_s"] if w in q else 0 for w in WORKLOADS],
                0.27,
                label=SYSTEM_NAMES[system],
            )
        ax.set_xticks(x, WORKLOADS, rotation=25, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"{n} ResNet-18-sized updates")
        ax.set_ylabel("median latency per query (s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
