"""A job's secure-aggregation parameters, checked once at creation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODULUS_BITS = 32
#: the initial weights' safetensors ``__metadata__`` entry with a job's parameters (JSON of
#: :meth:`SecAggConfig.to_spec`): how the SDK declares a job's secure aggregation
METADATA_KEY = "fedfaas.secagg"
#: the entry with the float model's layout (the SDK's JSON list of ``[name, shape]``)
LAYOUT_KEY = "fedfaas.secagg.layout"
#: options of a job that need individual updates, which secure aggregation hides
INCOMPATIBLE = {
    "aggregation": "robust rules and central DP read every update one by one",
    "fedbuff": "FedBuff weights each update by its own staleness",
    "drop_flagged": "flagging a client needs FLStore to read its update",
}
_KEYS = {"clip", "bits", "threshold", "neighbours", "max_weight", "stage_timeout_s"}


class SecAggConfigError(ValueError):
    """A secure-aggregation spec that cannot work; the message says which field and why."""


@dataclass(frozen=True)
class SecAggConfig:
    """Parameters of one job.

    Attributes
    ----------
    clip : every coordinate is clipped to ``[-clip, clip]`` before quantizing.
    bits : quantization levels ``2**bits - 1`` per coordinate (error at most ``clip / levels``
        per coordinate and client).
    threshold : shares that rebuild a client's seeds, as a fraction of its neighbours
        (``0 < threshold <= 1``); more dropouts than ``neighbours - shares`` fail the round.
    neighbours : neighbours per client (SecAgg+); ``None`` means every other client (SecAgg).
    max_weight : sample count that weighs 1; clients weigh ``min(n, max_weight) / max_weight``.
    stage_timeout_s : seconds the control plane waits for the clients that have not answered a
        stage (advertise, share keys, unmask) once the first answer came; then the stage closes
        with those that answered, and the clients left out count as dropped.
    """

    clip: float = 1.0
    bits: int = 16
    threshold: float = 2 / 3
    neighbours: int | None = None
    max_weight: int = 1000
    stage_timeout_s: float = 30.0

    @property
    def levels(self) -> int:
        return (1 << self.bits) - 1

    def max_clients(self) -> int:
        """Clients whose quantized sum cannot wrap around Z_2^32."""
        return ((1 << MODULUS_BITS) - 1) // self.levels

    def degree(self, n: int) -> int:
        """Neighbours of each client in a round of ``n`` clients (even, at most ``n - 1``)."""
        if self.neighbours is None or self.neighbours >= n - 1:
            return n - 1
        return self.neighbours

    def shares_needed(self, n: int) -> int:
        """Shares that rebuild one seed in a round of ``n`` clients (at least 2 where it can)."""
        k = self.degree(n)
        return max(min(2, k), math.ceil(self.threshold * k))

    def check_round(self, n: int) -> None:
        """Raise :class:`SecAggConfigError` unless a round of ``n`` clients can run."""
        if n < 3:
            raise SecAggConfigError(f"secure aggregation needs at least 3 clients, not {n}")
        if n > self.max_clients():
            raise SecAggConfigError(
                f"{n} clients of {self.bits}-bit updates can wrap around Z_2^32: at most "
                f"{self.max_clients()} (lower 'bits')"
            )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> SecAggConfig:
        """Check a job's ``secure_aggregation`` mapping; unknown keys and bad values raise
        :class:`SecAggConfigError` naming the field."""
        if not isinstance(spec, Mapping):
            raise SecAggConfigError("secure_aggregation must be an object")
        unknown = sorted(set(spec) - _KEYS)
        if unknown:
            raise SecAggConfigError(f"unknown secure_aggregation fields: {', '.join(unknown)}")
        cfg = cls(**{k: spec[k] for k in _KEYS & set(spec)})
        _check_number("clip", cfg.clip, float, lo=0.0, lo_open=True)
        _check_number("bits", cfg.bits, int, lo=2, hi=24)
        _check_number("threshold", cfg.threshold, float, lo=0.0, hi=1.0, lo_open=True)
        _check_number("max_weight", cfg.max_weight, int, lo=1)
        _check_number(
            "stage_timeout_s", cfg.stage_timeout_s, float, lo=0.0, hi=86400.0, lo_open=True
        )
        if cfg.neighbours is not None:
            _check_number("neighbours", cfg.neighbours, int, lo=2)
            if cfg.neighbours % 2:
                raise SecAggConfigError("neighbours must be even (half on each side of a ring)")
        return cfg

    def to_spec(self) -> dict[str, Any]:
        """The mapping :meth:`from_spec` reads back."""
        return {
            "clip": self.clip,
            "bits": self.bits,
            "threshold": self.threshold,
            "neighbours": self.neighbours,
            "max_weight": self.max_weight,
            "stage_timeout_s": self.stage_timeout_s,
        }


def refusals(options: Mapping[str, Any]) -> list[str]:
    """Why a job's other ``options`` (submit_job's names, unset ones ``None``) cannot run
    with secure aggregation; empty when they can."""
    return [f"{name}: {why}" for name, why in INCOMPATIBLE.items() if options.get(name) is not None]


def _check_number(
    name: str,
    value: Any,
    kind: type,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> None:
    ok_type = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok_type):
        raise SecAggConfigError(f"{name} must be a number ({kind.__name__}), not {value!r}")
    if not math.isfinite(value):
        raise SecAggConfigError(f"{name} must be finite, not {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise SecAggConfigError(f"{name} must be {'>' if lo_open else '>='} {lo}, not {value}")
    if hi is not None and value > hi:
        raise SecAggConfigError(f"{name} must be <= {hi}, not {value}")
