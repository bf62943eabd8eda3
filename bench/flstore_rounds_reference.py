"""bench-flstore's rounds of 120 and 200 updates: every system's answers held to the
independent reference (:mod:`bench.flstore_reference`), read from the round in MinIO."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from bench.flstore_reference import RTOL as REFERENCE_RTOL
from bench.flstore_reference import agrees, reference_from_store_streamed

log = logging.getLogger("bench.flstore")


def against_reference(
    cold: Any,
    asks: Sequence[tuple[str, dict[str, Any]]],
    asked: dict[str, dict[str, Any] | None],
) -> dict[str, Any]:
    """Each query's answers held to the independent reference (``asks``: the queries asked,
    ``(workload, body)`` as :func:`bench.flstore_rounds.queries` makes them)
    (:func:`bench.flstore_reference.reference_from_store_streamed`, on the objects in ``cold``):
    per workload, the keys the reference computes (``checked``; none: no reference) and, per
    system asked, the keys of its answer that differ beyond :data:`REFERENCE_RTOL` (empty: the
    same answer), or ``"no answer"``."""
    memo: dict[Any, Any] = {}
    out: dict[str, Any] = {}
    for wl, body in asks:
        try:
            ref = reference_from_store_streamed(cold, body, memo=memo)
        except Exception as exc:  # a result without the check, saying why, not no result
            log.exception("no reference answer to %s", wl)
            out[wl] = {"checked": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        row: dict[str, Any] = {"checked": None if ref is None else sorted(ref)}
        for system, res in asked.items():
            if res is None or ref is None:
                continue
            q = res["queries"].get(wl) or {}
            row[system] = agrees(q["result"], ref, REFERENCE_RTOL) if "result" in q else "no answer"
        out[wl] = row
    return {"rtol": REFERENCE_RTOL, "workloads": out}
