"""What bench-flstore's latency run asks: the queries of each round (:func:`round_queries`, and
:func:`evaluator_queries` on the digits job), its sizes, and the policies it compares."""

from __future__ import annotations

from typing import Any

POLICIES = ["flstore", "lru", "fifo", "lfu", "random", "static"]
JOB, DIGITS = "bench", "digits"
#: rounds of the digits job: each live digits row is asked once a round
DIGITS_ROUNDS = 8


def round_queries(job: str, r: int) -> list[tuple[str, dict[str, Any]]]:
    """The queries an analyst pipeline sends once round ``r`` is written (live, as in the
    paper: filtering, clustering, scheduling and tracking run for every new round; the
    cross-round workloads look at the last two rounds)."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("cosine-to-aggregate", {"rounds": [r], "params": {"bottom_k": 1}}),
        ("multi-krum", {"rounds": [r], "params": {"f": 1}}),
        ("kmeans", {"rounds": [r], "params": {"k": 2, "n_init": 1}}),
        ("personalize", {"rounds": [r], "params": {}}),
    ]
    if r >= 2:
        out += [
            ("foolsgold", {"params": {"first_round": r - 1, "last_round": r}}),
            ("provenance", {"params": {"first_round": r - 1, "last_round": r}}),
            ("oort", {"rounds": [r], "params": {"k": 3}}),
        ]
    out.append(("track", {"rounds": [r], "params": {"window": 10}}))
    return [(w, {"workload": w, "job": job, **b}) for w, b in out]


def evaluator_queries(job: str, r: int) -> list[tuple[str, dict[str, Any]]]:
    """Workloads that need the job's validation set (run on the real digits job)."""
    return [
        (wl, {"workload": wl, "job": job, "rounds": [r], "params": params})
        for wl, params in (
            ("leave-one-out", {}),
            ("shapley", {}),
            ("incentives", {"budget": 200}),
            ("evaluate", {}),
        )
    ]
