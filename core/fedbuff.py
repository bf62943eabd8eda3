"""Asynchronous FL with buffered aggregation (FedBuff: Nguyen et al., AISTATS 2022). Pure.

A job in async mode has no rounds that wait for their clients: its model has versions. A
client downloads version ``b``, trains on it and uploads to round ``b + 1`` as in a
synchronous job; the update is taken into the open buffer (round ``R``, which makes version
``R``) as long as its staleness ``s = R - (b + 1)`` is at most :attr:`AsyncSpec.max_staleness`.
Updates fold eagerly into the buffer with the staleness weight ``a = w(s)`` (1/sqrt(1+s) by
default) in place of the sample count; once the buffer holds ``K`` updates (the job's
``goal``) it is applied and the version advances:

    x_{R} = x_{R-1} + eta / K * sum_i a_i * (w_i - x_{b_i})

``w_i`` being the weights client ``i`` uploaded and ``x_{b_i}`` the model it trained on.
The hierarchy's result is the staleness-weighted mean ``m = sum a_i w_i / A`` of the uploads
(``A = sum a_i``), so the root subtracts, per base version ``b``, ``A_b x_b`` (``A_b``: the
staleness weights of the updates trained on ``b``) from ``A m``: the uploads stay full
weights, folded zero-copy as in sync mode, and the root keeps the last ``max_staleness + 1``
models (:func:`apply`).

The staleness functions are FedAsync's (Xie et al., 2019): ``"poly"`` ``(1 + s)^-a``
(``a = 0.5``: FedBuff's default), ``"hinge"`` ``1`` for ``s <= b`` else ``1 / (a (s - b) + 1)``
and ``"constant"`` ``1``.

A job asks for async mode in its initial weights' safetensors metadata (:data:`METADATA_KEY`,
a JSON object such as ``{"max_staleness": 4}``; the SDK's ``submit_job(mode="async")`` writes it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Vector = NDArray[np.float32]

#: the safetensors ``__metadata__`` entry of the initial weights asking for async mode
METADATA_KEY = "fedfaas.async"

STALENESS_FUNCTIONS = ("poly", "hinge", "constant")
#: the most versions an update may lag: the root keeps that many older models in memory
MAX_STALENESS = 64


class AsyncSpecError(ValueError):
    """An async-mode spec that is not valid (the message says what to change)."""


@dataclass(frozen=True)
class AsyncSpec:
    """How an async job weighs and applies its updates (see the module's docstring)."""

    max_staleness: int = 4
    staleness: str = "poly"
    a: float = 0.5
    b: int = 4
    eta: float = 1.0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AsyncSpec:
        """The spec of a JSON object; :class:`AsyncSpecError` saying what to change."""
        if not isinstance(raw, Mapping):
            raise AsyncSpecError(f"an async spec is a JSON object, not {type(raw).__name__}")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise AsyncSpecError(
                f"unknown keys {unknown}; an async spec has {sorted(cls.__dataclass_fields__)}"
            )
        fields = {**asdict(cls()), **raw}
        s, a, b, eta = fields["max_staleness"], fields["a"], fields["b"], fields["eta"]
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_STALENESS:
            raise AsyncSpecError(
                f"max_staleness must be an integer in 0..{MAX_STALENESS}, got {s!r}"
            )
        if fields["staleness"] not in STALENESS_FUNCTIONS:
            raise AsyncSpecError(
                f"staleness must be one of {list(STALENESS_FUNCTIONS)}, got {fields['staleness']!r}"
            )
        for name, v in (("a", a), ("eta", eta)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise AsyncSpecError(f"{name} must be a finite number, got {v!r}")
        if a < 0:
            raise AsyncSpecError(f"a must be >= 0 (staleness weights may not grow), got {a}")
        if eta <= 0:
            raise AsyncSpecError(f"eta (the server learning rate) must be > 0, got {eta}")
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise AsyncSpecError(f"b must be an integer >= 0, got {b!r}")
        return cls(int(s), str(fields["staleness"]), float(a), int(b), float(eta))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def weight(self, staleness: int) -> float:
        """The weight of an update ``staleness`` versions old."""
        s = staleness
        if s < 0:
            raise ValueError(f"staleness {s} < 0")
        if self.staleness == "constant":
            return 1.0
        if self.staleness == "hinge":
            return 1.0 if s <= self.b else 1.0 / (self.a * (s - self.b) + 1.0)
        return float((1.0 + s) ** -self.a)


def apply(
    spec: AsyncSpec,
    x: Vector,
    mean: Vector,
    count: int,
    base_weights: Mapping[int, float],
    base_models: Mapping[int, Vector],
) -> Vector:
    """The next model: ``x + eta / K * (A * mean - sum_b A_b * x_b)`` (see the module).

    ``x``: the current model; ``mean``: the buffer's staleness-weighted mean of the uploaded
    weights; ``count``: ``K``, the updates in it; ``base_weights``: base version -> ``A_b``;
    ``base_models``: base version -> that model. Computed in float64, returned float32.
    """
    missing = sorted(set(base_weights) - set(base_models))
    if missing:
        raise KeyError(f"base models {missing} are not kept")
    total = sum(base_weights.values())
    acc = mean.astype(np.float64) * total
    for b, wb in base_weights.items():
        acc -= wb * base_models[b].astype(np.float64)
    acc *= spec.eta / count
    acc += x
    return acc.astype(np.float32)
