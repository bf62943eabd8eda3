"""bench-flstore's report: the rows summed up (:func:`summary`, :func:`with_load`), the Markdown
rendered from the result JSON (:func:`markdown`) and the plot (:func:`plot`). Used by
:mod:`bench.flstore`."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from bench.flstore_plan import DIGITS_ROUNDS, POLICIES
from bench.flstore_rounds import SYSTEMS
from bench.flstore_rounds_report import markdown as rounds_md
from bench.flstore_shapley import markdown as shapley_md
from bench.runinfo import run_header


def _baseline_threads(rows: list[dict[str, Any]]) -> int | None:
    """The most BLAS/OpenMP threads the baselines' pools used on these queries (they say so in
    every answer); ``None`` when no answer said."""
    seen = [
        r[s]["threads"]
        for r in rows
        for s in ("objstore-agg", "cache-agg")
        if r[s].get("threads") is not None
    ]
    return max(seen) if seen else None


def _reference_count(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``rows`` were held to the independent reference, and how many differed."""
    checked = [r["reference"] for r in rows if r.get("reference") is not None]
    return {"checked": len(checked), "differ": sum(bool(d) for d in checked)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload, and for all the workloads (of each job), the rows' means, medians, hits,
    loads, same-answer and reference counts: what the tables show."""
    out: dict[str, Any] = {}
    for wl in dict.fromkeys(r["workload"] for r in rows):
        rr = [r for r in rows if r["workload"] == wl]
        m = {
            s: statistics.mean(r[s]["latency_s"] for r in rr)
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        out[wl] = {
            "queries": len(rr),
            "hits": sum(bool(r["fedfaas"].get("hit")) for r in rr),
            "objects_loaded": sum(int(r["fedfaas"].get("loaded") or 0) for r in rr),
            "mean_s": m,
            "median_s": {s: statistics.median(r[s]["latency_s"] for r in rr) for s in m},
            "reduction_vs_objstore": 1 - m["fedfaas"] / m["objstore-agg"],
            "reduction_vs_cache": 1 - m["fedfaas"] / m["cache-agg"],
            "same_result": all(r["same_result"] for r in rr),
            "reference": _reference_count(rr),
            "errors": sum("error" in r[s] for r in rr for s in m),
            "baseline_threads": _baseline_threads(rr),
        }
    for label, sel in (
        ("all", [r for r in rows if "(digits)" not in r["workload"]]),
        ("all (digits)", [r for r in rows if "(digits)" in r["workload"]]),
    ):
        if not sel:
            continue
        allm = {
            s: statistics.mean(r[s]["latency_s"] for r in sel)
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        mem = [r for r in sel if r["fedfaas"].get("hit") and not r["fedfaas"].get("loaded")]
        memm = {
            s: statistics.mean(r[s]["latency_s"] for r in mem) if mem else 0.0
            for s in ("fedfaas", "objstore-agg", "cache-agg")
        }
        out[label + " (served from memory)"] = {
            "queries": len(mem),
            "hits": len(mem),
            "objects_loaded": 0,
            "mean_s": memm,
            "reduction_vs_objstore": 1 - memm["fedfaas"] / memm["objstore-agg"] if mem else 0,
            "reduction_vs_cache": 1 - memm["fedfaas"] / memm["cache-agg"] if mem else 0,
            "same_result": all(r["same_result"] for r in mem),
            "baseline_threads": _baseline_threads(mem),
        }
        out[label] = {
            "queries": len(sel),
            "hits": sum(bool(r["fedfaas"].get("hit")) for r in sel),
            "objects_loaded": sum(int(r["fedfaas"].get("loaded") or 0) for r in sel),
            "mean_s": allm,
            "reduction_vs_objstore": 1 - allm["fedfaas"] / allm["objstore-agg"],
            "reduction_vs_cache": 1 - allm["fedfaas"] / allm["cache-agg"],
            "same_result": all(r["same_result"] for r in sel),
            "baseline_threads": _baseline_threads(sel),
        }
    return out


def with_load(mode: dict[str, Any]) -> dict[str, Any]:
    """Every query of a memo mode with what each system paid outside the timed queries, per
    query: FedFaaS's round loads + prefetch (at each round's end and after queries), Cache-Agg's
    mirror of the jobs into Redis; ObjStore-Agg pays nothing outside its queries."""
    rows = mode["queries"]
    n = len(rows)
    extra = {
        "fedfaas": mode["load_s"] + mode["prefetch_after_queries_s"],
        "objstore-agg": 0.0,
        "cache-agg": mode["cache_agg_mirror_s"],
    }
    m = {s: (sum(r[s]["latency_s"] for r in rows) + extra[s]) / n for s in SYSTEMS}
    return {
        "queries": n,
        "outside_queries_s": extra,
        "mean_s": m,
        "reduction_vs_objstore": 1 - m["fedfaas"] / m["objstore-agg"],
        "reduction_vs_cache": 1 - m["fedfaas"] / m["cache-agg"],
        "same_result": all(r["same_result"] for r in rows),
    }


def _reference_cell(ref: dict[str, int] | None) -> str:
    """FedFaaS's answers against the independent reference: "2/2" agree, "1 of 2 differ", or
    blank where the reference has none for the workload (or the result predates it)."""
    if not ref or not ref["checked"]:
        return ""
    if ref["differ"]:
        return f"**{ref['differ']} of {ref['checked']} differ**"
    return f"{ref['checked']}/{ref['checked']}"


def _pct(x: float) -> str:
    return f"{-100 * x:+.1f}%"


def markdown(res: dict[str, Any]) -> str:
    """The Markdown report, rendered from the result JSON (``write_result`` reads it back)."""
    lines = ["# FLStore benchmark", "", run_header(res["run"]), ""]
    if "latency" in res:
        lt = res["latency"]
        lines += [
            f"Model: {lt['model']} ({lt['floats_per_model']:,} float32, "
            f"{lt['model_mb']} MB per update); {lt['rounds']} rounds x "
            f"{lt['clients_per_round']} of {lt['pool']} clients in MinIO; 1 primary + "
            f"{lt['secondaries']} secondary per object. Mean latency per query, measured "
            "at the client. Rows marked (digits) run on a second, real job (softmax "
            f"regression on load_digits, 650 floats, {DIGITS_ROUNDS} rounds) because they "
            "need a validation-set evaluator. Live order: each round is ingested (hot data "
            "to the cache functions; MinIO already has it), then that round's queries "
            "arrive, each asked of the three systems in turn, the one that goes first "
            "rotating from query to query, each on an idle engine. Rows '(served from memory)' keep the queries that needed no load "
            "on the query path. The load and prefetch rows give what the timed queries leave "
            "out; 'all, load included' charges it to the queries.",
            "",
        ]
        for memo, mode in lt["modes"].items():
            tag = f"memo {memo}"
            lines += [
                f"### Inner-product memo {memo.upper()}",
                "",
                f"Method ({tag}): {mode['method']}. Cache-Agg's Redis reply parser: "
                f"{mode['redis_parser']}. The memo as each process reports it after the run: "
                + ", ".join(
                    f"{n} {'on' if x['gram_memo'] else 'off'} ({x['gram_pairs']} pairs)"
                    for n, x in {**mode["cache_functions"], **mode["baselines"]}.items()
                )
                + ". baseline threads: the most threads a BLAS/OpenMP pool of the baseline "
                "servers used on the row's queries (each answer says); the cache functions run "
                "with "
                + ", ".join(
                    f"{k}={v}" for k, v in mode["function_env"].items() if k.endswith("THREADS")
                )
                + ".",
                "",
                "| method | workload | queries | FedFaaS hits | loads on query path | FedFaaS s | "
                "ObjStore-Agg s | Cache-Agg s | vs ObjStore | vs Cache | same answer | "
                "= reference | baseline threads |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for wl, s in mode["summary"].items():
                mm = s["mean_s"]
                lines.append(
                    f"| {tag} | {wl} | {s['queries']} | {s['hits']} | "
                    f"{s.get('objects_loaded', '')} | {mm['fedfaas']:.3f} | "
                    f"{mm['objstore-agg']:.3f} | {mm['cache-agg']:.3f} | "
                    f"{_pct(s['reduction_vs_objstore'])} | {_pct(s['reduction_vs_cache'])} | "
                    f"{s['same_result']} | {_reference_cell(s.get('reference'))} | "
                    f"{s.get('baseline_threads', '')} |"
                )
            loads = mode["loads"]
            lines += [
                f"| {tag} | round load + prefetch into the cache functions (not in the query "
                f"rows; FedFaaS only, mean per round) | {len(loads)} rounds | | | "
                f"{mode['load_s'] / max(1, len(loads)):.3f} | - | - | | | | | |",
                f"| {tag} | background prefetch after queries (not in the query rows; FedFaaS "
                f"only, total) | | | | {mode['prefetch_after_queries_s']:.3f} | - | - | | | | | |",
                f"| {tag} | mirror of the jobs into Redis (not in the query rows; Cache-Agg only, "
                f"total, {mode['cache_agg_mirrored_objects']} objects) | | | | - | - | "
                f"{mode['cache_agg_mirror_s']:.3f} | | | | | |",
            ]
            w = mode["with_load"]
            mm = w["mean_s"]
            lines.append(
                f"| {tag} | **all, load included** (every query + the rows above, per query) | "
                f"{w['queries']} | | | {mm['fedfaas']:.3f} | {mm['objstore-agg']:.3f} | "
                f"{mm['cache-agg']:.3f} | {_pct(w['reduction_vs_objstore'])} | "
                f"{_pct(w['reduction_vs_cache'])} | {w['same_result']} | | |"
            )
            lines.append("")
            if mode.get("steady"):
                lines += steady_md(tag, mode["steady"])
        lines += [
            "Targets: >= 90% lower mean latency than ObjStore-Agg, >= 80% lower than Cache-Agg.",
            "",
        ]
    if "handoff" in res:
        lines += handoff_md(res["handoff"])
    if "shapley" in res:
        lines += shapley_md(res["shapley"])
    if "big_rounds" in res:
        lines += rounds_md(res["big_rounds"])
    if "policies" in res:
        lines += policies_md(res["policies"])
    if "overhead" in res:
        lines += overhead_md(res["overhead"])
    return "\n".join(lines) + "\n"


def policies_md(policies: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Policy hit rates (capacity 64 objects)",
        "",
        "| trace | " + " | ".join(POLICIES) + " |",
        "|---|" + "---|" * len(POLICIES),
    ]
    by = {(p["trace"], p["policy"]): p for p in policies}
    for t in dict.fromkeys(p["trace"] for p in policies):
        cells = [f"{100 * by[(t, p)]['hit_rate']:.2f}%" for p in POLICIES]
        lines.append(f"| {t} ({by[(t, 'flstore')]['requests']} req) | " + " | ".join(cells) + " |")
    return lines + [
        "",
        "Request-level hit rate (a request hits when all its objects are resident). "
        "Traces: "
        + "; ".join(
            f"{t}: {by[(t, 'flstore')]['note']}"
            for t in dict.fromkeys(p["trace"] for p in policies)
        ),
        "",
    ]


def overhead_md(overhead: dict[str, Any]) -> list[str]:
    lines = [
        "## Lookup overhead",
        "",
        "| entries | engine lookup p99 us | engine table MB | Redis lookup p99 us | "
        "Redis table MB | tracker record GET p99 us | tracker records MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, o in overhead.items():
        lines.append(
            f"| {int(n):,} | {o['engine_table_lookup_p99_us']:.2f} | "
            f"{o['engine_table_memory_mb']:.2f} | {o['redis_table_lookup_p99_us']:.1f} | "
            f"{o['redis_table_memory_mb']:.2f} | {o['tracker_record_get_p99_us']:.1f} | "
            f"{o['tracker_records_memory_mb']:.2f} |"
        )
    return lines + ["", "Target: lookup <= 100 us p99."]


def steady_md(tag: str, steady: dict[str, Any]) -> list[str]:
    n = next(iter(steady.values()))["queries"]
    lines = [
        f"Small queries of the digits job in steady state ({tag}): each asked {n} times of "
        "each system, the system that goes first rotating (after two unmeasured askings), on "
        "an idle engine; the live rows above ask each once a round, right after the ResNet "
        "job's heavy queries. 'FedFaaS - Cache-Agg': the mean of the paired differences, "
        "with its 95% confidence interval (Student's t); an interval that spans 0 is a "
        "difference this run cannot tell from noise. 'kept': FedFaaS askings the request "
        "tracker answered on the plan it kept from an earlier asking (no call to the cache "
        "engine; for track and oort, whose answer the engine gives from the rounds' metadata, "
        "the kept answer itself).",
        "",
        "| workload | queries | FedFaaS mean ms | median ms | kept | ObjStore-Agg mean ms | "
        "Cache-Agg mean ms | median ms | vs Cache | FedFaaS - Cache-Agg ms (95% CI) | "
        "same answer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, x in steady.items():
        m, md = x["mean_s"], x["median_s"]
        lo, hi = x["diff_vs_cache_ci95_s"]
        lines.append(
            f"| {wl} | {x['queries']} | {1e3 * m['fedfaas']:.2f} | {1e3 * md['fedfaas']:.2f} | "
            f"{x['plans_kept']} | {1e3 * m['objstore-agg']:.2f} | "
            f"{1e3 * m['cache-agg']:.2f} | "
            f"{1e3 * md['cache-agg']:.2f} | {_pct(x['reduction_vs_cache'])} | "
            f"{1e3 * x['diff_vs_cache_s']:+.2f} ({1e3 * lo:+.2f} to {1e3 * hi:+.2f}) | "
            f"{x['same_result']} |"
        )
    return [*lines, ""]


def handoff_md(hd: dict[str, Any]) -> list[str]:
    by = {p: [x["seconds"] for x in hd["rows"] if x["path"] == p] for p in ("shm", "minio")}
    shm, mio = statistics.mean(by["shm"]), statistics.mean(by["minio"])
    lines = [
        "## Zero-copy handoff: round complete -> all updates resident in the cache",
        "",
        f"{hd['clients']} updates per round ({hd['model']}, {hd['model_mb']} MB each), "
        f"{hd['rounds']} rounds per path, alternating on one stack (one copy per "
        "object). The clock starts at the engine's round notice and stops when the engine's "
        "location table names a holder for every update of the round. shm: the cache "
        "function claims the round from the node's store (the gateway's handoff code, "
        "played by the benchmark process) and maps each update in place; MinIO: it reads "
        "and decodes each update from MinIO.",
        "",
        "| path | rounds | mean s | min s | max s | vs MinIO |",
        "|---|---|---|---|---|---|",
    ]
    for p, xs in by.items():
        lines.append(
            f"| {'shm (mapped in place)' if p == 'shm' else 'MinIO (read + decode)'} | "
            f"{len(xs)} | {statistics.mean(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | "
            f"{statistics.mean(xs) / mio:.3f}x |"
        )
    lines += [
        "",
        f"Speed-up of the handoff: {mio / shm:.1f}x. Objects mapped in place (engine count): "
        f"{hd['handed_off']}.",
        "",
        "| cache function | objects | mapped in place | private MB (RssAnon) | "
        "shared MB (RssShmem) |",
        "|---|---|---|---|---|",
    ]
    for fn, m in hd["functions"].items():
        lines.append(
            f"| {fn} | {m['objects']} | {m['mapped_in_place']} | {m['private_mb']:.0f} | "
            f"{m['shared_mb']:.0f} |"
        )
    lines += [
        "",
        "Private memory holds the objects read from MinIO (both jobs' initial models and "
        "metadata included); the mapped updates are the store's own pages, counted in "
        "RssShmem only once a query touches them, and never copied.",
    ]
    return [*lines, ""]


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    if "latency" in res:
        modes = res["latency"]["modes"]
        first = modes.get("on") or next(iter(modes.values()))
        axes[0].set_title(f"inner-product memo {first['memo']} on all three")
        summ = {k: v for k, v in first["summary"].items() if not k.startswith("all")}
        names = list(summ)
        x = np.arange(len(names))
        for i, s in enumerate(("fedfaas", "objstore-agg", "cache-agg")):
            axes[0].bar(x + (i - 1) * 0.27, [summ[n]["mean_s"][s] for n in names], 0.27, label=s)
        axes[0].set_xticks(x, names, rotation=35, ha="right")
        axes[0].set_yscale("log")
        axes[0].set_ylabel("mean latency per query (s)")
        axes[0].legend()
    by = {(p["trace"], p["policy"]): p["hit_rate"] for p in res.get("policies", [])}
    traces = list(dict.fromkeys(p["trace"] for p in res.get("policies", [])))
    x = np.arange(len(traces))
    for i, p in enumerate(POLICIES):
        axes[1].bar(x + (i - 2.5) * 0.13, [100 * by[(t, p)] for t in traces], 0.13, label=p)
    axes[1].set_xticks(x, traces, rotation=20)
    axes[1].set_ylabel("hit rate (%)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
