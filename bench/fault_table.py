"""The fault campaign's table (:mod:`bench.faults`): one row per fault, and whether it
passes (every run survived with evidence that its fault hit work in flight)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.runinfo import run_header


def summary(fault: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: runs, survived, hit in flight, acknowledged, lost, double,
    recovery p50/p99, one run's evidence."""
    jobs = fault["jobs"]
    rec = [j["recovery_s"] for j in jobs if j["recovery_s"] is not None]
    left = fault["leftovers"]
    return {
        "fault": f"({fault['letter']}) {fault['what']}",
        "model": fault.get("model", ""),
        "runs": len(jobs),
        "survived": sum(1 for j in jobs if j["survived"]),
        "hit": sum(1 for j in jobs if j.get("hit")),
        "acked": sum(j["acked"] for j in jobs),
        "lost": sum(j["checks"].get("lost", 0) for j in jobs),
        "double": sum(j["checks"].get("double", 0) for j in jobs),
        "busy_refusals": sum(j["checks"].get("busy_refusals", 0) for j in jobs),
        "recovery_p50_s": float(np.percentile(rec, 50)) if rec else None,
        "recovery_p99_s": float(np.percentile(rec, 99)) if rec else None,
        "left_behind": bool(left["shm"] or left["processes"]),
        "evidence": next((j["evidence"] for j in jobs if j.get("hit")), ""),
        "why_not": sorted({_why(j) for j in jobs if not j["survived"] or not j.get("hit")}),
    }


def passed(row: dict[str, Any]) -> bool:
    """Every run survived, with evidence that its fault hit work in flight, nothing lost,
    nothing counted twice, nothing left behind."""
    return bool(
        row["runs"]
        and row["survived"] == row["hit"] == row["runs"]
        and row["lost"] == row["double"] == 0
        and not row["left_behind"]
    )


def _why(job: dict[str, Any]) -> str:
    if job["error"]:
        return str(job["error"])[:160]
    ch = job["checks"]
    failed = [
        k + (f" ({ch[k + '_error']})" if k + "_error" in ch else "")
        for k in ("finished", "exact", "checkpoints", "queries", "query_in_flight")
        if ch.get(k) is False
    ]
    if not failed and (ch.get("lost") or ch.get("double")):
        failed = [f"lost {ch.get('lost')}, double {ch.get('double')}"]
    if not job.get("hit"):
        failed.append(f"not shown to hit work in flight: {job.get('evidence', '')}"[:200])
    return ", ".join(failed)


def to_markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Fault campaign (`make test-faults`)",
        "",
        run_header(r["run"]),
        "",
        f"Each fault on a fresh `fedfaas up --with all`; {r['clients']} clients, {r['rounds']} "
        f"rounds per job, the fault at a random point of a random round (FLStore's faults: "
        f"during a query). `503 waits`: uploads the SDK sent again after a 503 with "
        f"Retry-After (a node out of room). `lost`/`double`: acknowledged updates missing "
        f"from / counted more than once in the round's checkpointed `meta.json`; every "
        f"round's global model checked against the FedAvg of exactly the acknowledged updates. "
        f"`hit`: runs whose fault is shown to have reached work in flight (the evidence column "
        f"gives one run's). Recovery: from the fault (for MinIO, the end of its outage) until "
        f"every part and function is ready.",
        "",
        "| fault | model | runs | survived | hit | updates acknowledged | lost | double-counted "
        "| 503 waits | recovery p50 (s) | recovery p99 (s) | left behind | evidence "
        "| why not |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for f in r["faults"]:
        s = summary(f)
        p50 = "-" if s["recovery_p50_s"] is None else f"{s['recovery_p50_s']:.2f}"
        p99 = "-" if s["recovery_p99_s"] is None else f"{s['recovery_p99_s']:.2f}"
        lines.append(
            f"| {s['fault']} | {s['model']} | {s['runs']} | {s['survived']} | {s['hit']} "
            f"| {s['acked']} | {s['lost']} | {s['double']} | {s['busy_refusals']} | {p50} "
            f"| {p99} | {'yes' if s['left_behind'] else 'no'} | {s['evidence'] or '-'} "
            f"| {'; '.join(s['why_not']) or '-'} |"
        )
    if r.get("not_run"):
        lines += ["", "Not run:"]
        lines += [f"- ({k}) {v}" for k, v in r["not_run"].items()]
    return "\n".join(lines) + "\n"
