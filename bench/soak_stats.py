"""Locust's statistics of a soak (:mod:`bench.soak`): per route, over time, the load's own
exceptions, and each failure counted inside the fault window (expected) or outside (an
error)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any


def read_stats(prefix: Path) -> list[dict[str, Any]]:
    """Per route: requests, failures, requests/s, p50/p99/mean (ms; None where locust has
    none), from locust's stats CSV."""
    rows = []
    with open(f"{prefix}_stats.csv") as f:
        for row in csv.DictReader(f):
            rows.append(
                {
                    "route": row["Name"],
                    "method": row["Type"],
                    "requests": int(row["Request Count"]),
                    "failures": int(row["Failure Count"]),
                    "rps": float(row["Requests/s"]),
                    "p50_ms": _ms(row["50%"]),
                    "p99_ms": _ms(row["99%"]),
                    "mean_ms": _ms(row["Average Response Time"]),
                }
            )
    return rows


def _ms(cell: str) -> float | None:
    """A latency cell of locust's CSV; None for ``N/A`` (a route with no request answered
    yet: no latency, not a latency of 0)."""
    return None if cell in ("", "N/A") else float(cell)


def read_history(prefix: Path, t0: float) -> list[dict[str, float]]:
    """Throughput and failures per second over time (locust's aggregated history)."""
    out: list[dict[str, float]] = []
    path = Path(f"{prefix}_stats_history.csv")
    if not path.exists():
        return out
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["Name"] != "Aggregated":
                continue
            out.append(
                {
                    "t": round(float(row["Timestamp"]) - t0, 1),
                    "rps": float(row["Requests/s"]),
                    "fails_per_s": float(row["Failures/s"]),
                }
            )
    return out


def kind(error: str) -> str:
    """A failure's kind: ``HTTP <status> <error code>`` or the exception's class."""
    m = re.search(r"HTTP (\d+): \{\s*\"error\": ?\"([a-z_]+)\"", error)
    if m:
        return f"HTTP {m.group(1)} {m.group(2)}"
    m = re.search(r"HTTP (\d+)", error)
    if m:
        return f"HTTP {m.group(1)}"
    return error.split("(", 1)[0]


def read_exceptions(prefix: Path) -> list[dict[str, Any]]:
    """Exceptions raised in the load's own tasks (locust's exceptions CSV): a broken load
    generator is an error of the run, not a quiet gap in it."""
    path = Path(f"{prefix}_exceptions.csv")
    if not path.exists():
        return []
    with open(path) as f:
        return [
            {"count": int(row["Count"]), "message": row["Message"][:300]}
            for row in csv.DictReader(f)
        ]


def classify(failures: list[dict[str, Any]], window: tuple[float, float]) -> dict[str, Any]:
    """Failures inside the fault window (expected) and outside it (errors), by route and
    kind (:func:`kind`)."""
    inside: dict[str, int] = {}
    outside: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    for f in failures:
        where = inside if window[0] <= f["t"] <= window[1] else outside
        key = f"{f['name']}: {kind(f['error'])}"
        where[key] = where.get(key, 0) + 1
        if where is outside and len(examples) < 10:
            examples.append(f)
    return {
        "in_fault_window": inside,
        "outside": outside,
        "errors": sum(outside.values()),
        "expected": sum(inside.values()),
        "outside_examples": examples,
    }
