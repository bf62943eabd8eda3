"""Hyperparameter and metric tracking over the last R rounds (P4: small metadata dicts).

Series of every numeric round metric, configuration diffs between consecutive rounds, per-client
participation summaries, and two checks: a loss plateau (suggest ``lr * lr_factor``) and divergence
(non-finite loss, loss above ``divergence_factor`` times the window's best, or rising ``patience``
rounds in a row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from .base import Params
from .data import Requirements, WorkloadData
from .errors import MissingData


class TrackParams(Params):
    round: int = Field(ge=1, description="latest round of the window")
    window: int = Field(default=10, ge=1, le=10_000, description="rounds tracked (P4's R)")
    metrics: list[str] = Field(
        default=["loss", "accuracy", "duration_s"], description="round metric keys"
    )
    loss_key: str = Field(
        default="loss", description="metric used by the plateau/divergence checks"
    )
    patience: int = Field(
        default=3, ge=1, description="rounds without improvement that make a plateau"
    )
    min_rel_improvement: float = Field(
        default=0.01, ge=0.0, description="relative loss improvement that counts"
    )
    divergence_factor: float = Field(
        default=1.5, gt=1.0, description="loss above this x best = divergence"
    )
    lr_factor: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="suggested lr multiplier on a plateau"
    )


def track_requirements(p: TrackParams) -> Requirements:
    rounds = tuple(range(max(1, p.round - p.window + 1), p.round + 1))
    return Requirements(policy="P4", round_meta_rounds=rounds, client_meta_rounds=rounds)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def _json(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, list | tuple):
        return [_json(v) for v in x]
    if isinstance(x, Mapping):
        return {str(k): _json(v) for k, v in x.items()}
    return x


def run_track(data: WorkloadData, p: TrackParams) -> dict[str, Any]:
    rounds = list(range(max(1, p.round - p.window + 1), p.round + 1))
    missing = [r for r in rounds if r not in data.round_meta]
    if missing:
        raise MissingData("round_meta", round=missing[0])
    meta = [data.round_meta[r] for r in rounds]
    series = {k: [_num(m.get(k)) for m in meta] for k in p.metrics}
    config_keys = sorted({k for m in meta for k in m} - set(p.metrics) - {"selected"})
    changes = [
        {"round": r, "key": k, "from": _json(prev.get(k)), "to": _json(cur.get(k))}
        for r, prev, cur in zip(rounds[1:], meta[:-1], meta[1:], strict=True)
        for k in config_keys
        if prev.get(k) != cur.get(k)
    ]
    selected = [list(m.get("selected", [])) for m in meta]
    clients: dict[str, dict[str, Any]] = {}
    for r in rounds:
        for c, cm in data.client_meta.get(r, {}).items():
            s = clients.setdefault(c, {"rounds": [], "loss": [], "duration_s": []})
            s["rounds"].append(r)
            for key in ("loss", "duration_s"):
                v = _num(cm.get(key))
                if v is not None:
                    s[key].append(v)
    client_summary = {
        c: {
            "participations": len(s["rounds"]),
            "last_round": s["rounds"][-1],
            "mean_loss": float(np.mean(s["loss"])) if s["loss"] else None,
            "mean_duration_s": float(np.mean(s["duration_s"])) if s["duration_s"] else None,
        }
        for c, s in sorted(clients.items())
    }
    losses = np.array(
        [v if v is not None else np.nan for v in (_num(m.get(p.loss_key)) for m in meta)]
    )
    checks = _checks(losses, _num(meta[-1].get(p.loss_key)), p, meta[-1].get("lr"))
    return {
        "rounds": rounds,
        "series": _json(series),
        "config": {k: _json(meta[-1].get(k)) for k in config_keys},
        "config_changes": changes,
        "selected": selected,
        "clients": client_summary,
        **checks,
    }


def _checks(losses: np.ndarray, last_raw: float | None, p: TrackParams, lr: Any) -> dict[str, Any]:
    """Plateau and divergence checks; ``losses`` has NaN where the metric is missing or NaN."""
    seen = losses[~np.isnan(losses)]
    out: dict[str, Any] = {"plateau": False, "diverging": False, "reasons": [], "suggestion": None}
    if last_raw is not None and not math.isfinite(last_raw):
        out["diverging"] = True
        out["reasons"].append(f"last loss is not finite ({last_raw})")
    if seen.size == 0:
        if not out["reasons"]:
            out["reasons"].append(f"no {p.loss_key!r} in the window")
        return out
    last = losses[-1]
    finite = seen[np.isfinite(seen)]
    if (
        finite.size
        and np.isfinite(last)
        and last > p.divergence_factor * finite.min()
        and finite.min() > 0
    ):
        out["diverging"] = True
        out["reasons"].append(
            f"last loss {last:.6g} > {p.divergence_factor} x best {finite.min():.6g}"
        )
    tail = losses[-(p.patience + 1) :]
    if tail.size == p.patience + 1 and np.all(np.isfinite(tail)) and np.all(np.diff(tail) > 0):
        out["diverging"] = True
        out["reasons"].append(f"loss rose {p.patience} rounds in a row")
    if losses.size > p.patience and not out["diverging"]:
        before = losses[: -p.patience]
        recent = losses[-p.patience :]
        if np.all(np.isfinite(before)) and np.all(np.isfinite(recent)):
            best_before = before.min()
            if recent.min() > best_before * (1.0 - p.min_rel_improvement):
                out["plateau"] = True
                out["reasons"].append(
                    f"best loss of the last {p.patience} rounds {recent.min():.6g} did not improve on"
                    f" {best_before:.6g} by {p.min_rel_improvement:.0%}"
                )
                lr_v = _num(lr)
                out["suggestion"] = (
                    {"lr": lr_v * p.lr_factor} if lr_v is not None else {"lr_factor": p.lr_factor}
                )
    return out
