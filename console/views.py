"""What the job page shows, derived from the control plane's job view (pure functions).

* :func:`timeline`: the job's rounds in order, the ended ones (``history``) then the open one,
  each with its state, duration, updates, whether it was published and reopened;
* :func:`stragglers`: per node, clients of the open round whose update has not arrived;
* :func:`series`: per round, the clients' mean loss (their metadata, FLStore's ``track``)
  and the global model's accuracy (FLStore's ``evaluate``).
"""

from __future__ import annotations

import time
from typing import Any


def timeline(view: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """One row per round: ``round``, ``state``, ``seconds``, ``updates``, ``published``,
    ``reopened``, ``deadline_in_s`` (the open round: seconds to its deadline)."""
    rows = [
        {
            "round": h.get("round"),
            "state": h.get("state"),
            "seconds": h.get("seconds"),
            "updates": h.get("aggregated")
            if h.get("aggregated") is not None
            else h.get("received"),
            "published": h.get("published"),
            "reopened": None,
            "deadline_in_s": None,
            "selected_by": h.get("selected_by"),
        }
        for h in view.get("history") or []
    ]
    cur = view.get("round")
    if cur and cur.get("number") not in {r["round"] for r in rows}:
        now = time.time() if now is None else now
        opened, deadline = cur.get("opened_at"), cur.get("deadline_at")
        rows.append(
            {
                "round": cur.get("number"),
                "state": cur.get("state"),
                "seconds": None if opened is None else max(0.0, now - opened),
                "updates": sum((cur.get("received") or {}).values()),
                "published": cur.get("published"),
                "reopened": cur.get("reopened"),
                "deadline_in_s": None if deadline is None else deadline - now,
                "selected_by": cur.get("selected_by"),
            }
        )
    return rows


def stragglers(view: dict[str, Any]) -> dict[str, int]:
    """Per node, how many of the open round's placed clients have not sent their update."""
    cur = view.get("round")
    if not cur or cur.get("state") not in ("open", "aggregating"):
        return {}
    received = cur.get("received") or {}
    out = {}
    for node, placed in (cur.get("clients_per_node") or {}).items():
        late = int(placed) - int(received.get(node, 0))
        if late > 0:
            out[node] = late
    return out


def client_loss(track: dict[str, Any] | None) -> float | None:
    """The mean of the clients' reported ``loss`` in a one-round ``track`` answer (None when
    none reported one)."""
    clients = (track or {}).get("clients") or {}
    losses = [c["mean_loss"] for c in clients.values() if c.get("mean_loss") is not None]
    return sum(losses) / len(losses) if losses else None


def series(
    rounds: list[int],
    tracks: list[dict[str, Any] | None],
    evaluations: list[dict[str, Any] | None],
) -> dict[str, Any]:
    """Per round: the clients' mean ``loss`` (their metadata, FLStore's ``track`` of that
    round) and the global model's ``accuracy`` on the job's validation data (FLStore's
    ``evaluate``; None for a job without an evaluator)."""
    accuracy = []
    for e in evaluations:
        value = ((e or {}).get("metrics") or {}).get("accuracy")
        accuracy.append(float(value) if isinstance(value, int | float) else None)
    return {"rounds": rounds, "loss": [client_loss(t) for t in tracks], "accuracy": accuracy}
