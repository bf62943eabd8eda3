"""The fault campaign's table (:mod:`bench.faults`): one row per fault, and whether it
passes (every run survived with evidence that its fault hit work in flight). A run of some
faults is merged into the stored result (:func:`merge_results`): each row keeps the record of
the run it came from, and the table names that run's commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
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


def merge_results(
    stored: dict[str, Any] | None, new: dict[str, Any], order: Sequence[str]
) -> dict[str, Any]:
    """The campaign's result once ``new`` (a run of some faults) lands on ``stored`` (the
    result as stored before, or None).

    The faults ``new`` tried (a row, or a "not run" line) lose what ``stored`` said of them;
    every other row and "not run" line of ``stored`` is kept. Each row carries the record of
    the run that made it (``run``: commit, start, command, machine; ``clients``, ``rounds``),
    a row of an older result without one gets its result's. Rows come in the campaign's
    ``order`` of letters. ``run``, ``clients``, ``rounds`` and ``runs`` at the top are
    ``new``'s. Neither argument is changed.
    """
    tried = {f["letter"] for f in new["faults"]} | set(new.get("not_run") or {})
    rows: dict[str, dict[str, Any]] = {}
    not_run: dict[str, str] = {}
    for result, fresh in ((stored, False), (new, True)):
        if not result:
            continue
        made = {k: result.get(k) for k in ("run", "clients", "rounds")}
        for f in result.get("faults") or []:
            if fresh or f["letter"] not in tried:
                rows[f["letter"]] = {**made, **f}  # a row's own record wins
        for letter, why in (result.get("not_run") or {}).items():
            if fresh or letter not in tried:
                not_run[letter] = why
    rank = {letter: i for i, letter in enumerate(order)}

    def place(letter: str) -> tuple[int, str]:
        return (rank.get(letter, len(rank)), letter)

    return {
        **{k: new.get(k) for k in ("run", "clients", "rounds", "runs")},
        "faults": [rows[k] for k in sorted(rows, key=place)],
        "not_run": {k: not_run[k] for k in sorted(not_run, key=place)},
    }


def stored_result(path: Path) -> dict[str, Any] | None | str:
    """The stored result a run merges into (None: none yet), or why it cannot be one (read
    before the campaign starts, not after it ran for an hour)."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path} is not a fault campaign result ({exc}); move it away to start afresh"
    if not isinstance(stored, dict) or not isinstance(stored.get("faults"), list):
        return f"{path} is not a fault campaign result (no faults list); move it away"
    return stored


def _run_cell(row: dict[str, Any], top: dict[str, Any]) -> str:
    """Which run made ``row``: its commit and start (and its size when not the table's)."""
    run = row.get("run") or top.get("run") or {}
    c = run.get("commit") or {}
    cell = f"{(c.get('sha') or 'unknown')[:7]}{' dirty' if c.get('dirty') else ''}"
    if not row.get("tls"):  # runs before 2026-11-28 used plain HTTP (--no-tls)
        cell += " plain HTTP"
    started = run.get("started") or run.get("time")
    if started:
        cell += f" {str(started)[:16].replace('T', ' ')}"
    size = (row.get("clients", top["clients"]), row.get("rounds", top["rounds"]))
    if size != (top["clients"], top["rounds"]):
        cell += f" ({size[0]} clients, {size[1]} rounds)"
    return cell


def _older_runs(r: dict[str, Any]) -> list[str]:
    """One line per run other than the latest that made a row of ``r``."""
    latest = r["run"]
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in r["faults"]:
        run = f.get("run")
        if run and run != latest:
            seen.setdefault((run.get("started"), str(run.get("commit"))), run)
    return [f"- {run_header(run)}" for run in seen.values()]


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
        f"Each fault on a fresh `fedfaas up --with all`, TLS (its default; the run column "
        f"says `plain HTTP` for a row made on `--no-tls`); {r['clients']} clients, {r['rounds']} "
        f"rounds per job, the fault at a random point of a random round (FLStore's faults: "
        f"during a query). `503 waits`: uploads the SDK sent again after a 503 with "
        f"Retry-After (a node out of room). `lost`/`double`: acknowledged updates missing "
        f"from / counted more than once in the round's checkpointed `meta.json`; every "
        f"round's global model checked against the FedAvg of exactly the acknowledged updates. "
        f"`hit`: runs whose fault is shown to have reached work in flight (the evidence column "
        f"gives one run's). Recovery: from the fault (for MinIO, the end of its outage) until "
        f"every part and function is ready. `run`: the commit and start of the run that made "
        f"the row (a run of some faults keeps the other rows of the runs before).",
        "",
        "| fault | model | runs | survived | hit | updates acknowledged | lost | double-counted "
        "| 503 waits | recovery p50 (s) | recovery p99 (s) | left behind | evidence "
        "| why not | run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for f in r["faults"]:
        s = summary(f)
        p50 = "-" if s["recovery_p50_s"] is None else f"{s['recovery_p50_s']:.2f}"
        p99 = "-" if s["recovery_p99_s"] is None else f"{s['recovery_p99_s']:.2f}"
        lines.append(
            f"| {s['fault']} | {s['model']} | {s['runs']} | {s['survived']} | {s['hit']} "
            f"| {s['acked']} | {s['lost']} | {s['double']} | {s['busy_refusals']} | {p50} "
            f"| {p99} | {'yes' if s['left_behind'] else 'no'} | {s['evidence'] or '-'} "
            f"| {'; '.join(s['why_not']) or '-'} | {_run_cell(f, r)} |"
        )
    older = _older_runs(r)
    if older:
        lines += ["", "Rows made by earlier runs:", *older]
    if r.get("not_run"):
        lines += ["", "Not run:"]
        lines += [f"- ({k}) {v}" for k, v in r["not_run"].items()]
    return "\n".join(lines) + "\n"
