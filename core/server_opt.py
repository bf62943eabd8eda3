"""Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021). Pure.

The top aggregator's result is the FedAvg ``a`` of the round's updates; a server optimizer
treats ``d = a - x`` (``x``: the global model the round started from) as a pseudo-gradient and
steps ``x`` with its own learning rate and state, element by element on the flat model:

- ``fedavgm``: ``p = x - a``; with momentum ``mu``: ``m = p`` in round 1, else
  ``m = mu * m + p``, and ``p = m``; then ``x <- x - eta * p``.
- ``fedadam``: ``m = b1 m + (1-b1) d``; ``v = b2 v + (1-b2) d^2``;
  ``x <- x + eta * sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) * m / (sqrt(v) + tau)``.
- ``fedyogi``: ``v = v - (1-b2) d^2 sign(v - d^2)``; ``x <- x + eta m / (sqrt(v) + tau)``.
- ``fedadagrad``: ``m = d``; ``v = v + d^2``; ``x <- x + eta m / (sqrt(v) + tau)``.

These are the rules of Flower's strategies of the same names (``flwr.server.strategy``,
1.32), bias correction of FedAdam included, with the same defaults; ``t`` is the round.
The state (``m``, ``v``) has the model's shape and is float32, as the model.

A job names its optimizer in its initial weights' safetensors metadata (:data:`METADATA_KEY`,
a JSON object such as ``{"name": "fedadam", "eta": 0.01}``; the SDK's
``submit_job(server_opt=...)`` writes it). The root gateway applies it when it publishes a
round (:mod:`gateway.server_opt`) and checkpoints the state beside the model
(:func:`state_to_safetensors`: the spec travels with it, so a resumed job finds both).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Vector = NDArray[np.float32]

#: name -> Flower's defaults (eta, beta_1, beta_2, tau, momentum)
DEFAULTS: dict[str, dict[str, float]] = {
    "fedavgm": {"eta": 1.0, "beta_1": 0.0, "beta_2": 0.0, "tau": 0.0, "momentum": 0.0},
    "fedadam": {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-9, "momentum": 0.0},
    "fedyogi": {"eta": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3, "momentum": 0.0},
    "fedadagrad": {"eta": 0.1, "beta_1": 0.0, "beta_2": 0.0, "tau": 1e-9, "momentum": 0.0},
}

#: name -> the hyperparameters a spec may set (the others are fixed by the rule)
SETTABLE: dict[str, tuple[str, ...]] = {
    "fedavgm": ("eta", "momentum"),
    "fedadam": ("eta", "beta_1", "beta_2", "tau"),
    "fedyogi": ("eta", "beta_1", "beta_2", "tau"),
    "fedadagrad": ("eta", "tau"),
}


#: the safetensors ``__metadata__`` entry (initial weights, state checkpoints) naming the optimizer
METADATA_KEY = "core.server_opt"


class ServerOptError(ValueError):
    """A server optimizer spec that is not valid (the message says what to change)."""


@dataclass(frozen=True)
class ServerOptimizer:
    """One job's server optimizer: ``name`` and its hyperparameters (see the module)."""

    name: str
    eta: float
    beta_1: float
    beta_2: float
    tau: float
    momentum: float

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ServerOptimizer:
        """``{"name": "fedadam", "eta": 0.01, ...}``; unnamed hyperparameters take Flower's
        defaults for that optimizer."""
        if not isinstance(raw, Mapping):
            raise ServerOptError("the server optimizer must be a JSON object with a 'name'")
        name = raw.get("name")
        if name not in DEFAULTS:
            raise ServerOptError(
                f"server optimizer {name!r} unknown; one of {', '.join(sorted(DEFAULTS))}"
            )
        extra = set(raw) - {"name", *SETTABLE[name]}
        if extra:
            raise ServerOptError(
                f"{name} takes {', '.join(SETTABLE[name])}; not {', '.join(sorted(extra))}"
            )
        vals: dict[str, float] = {}
        for k, default in DEFAULTS[name].items():
            v = raw.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ServerOptError(f"{name}: {k} must be a finite number, got {v!r}")
            vals[k] = float(v)
        if vals["eta"] <= 0:
            raise ServerOptError(f"{name}: eta (the server learning rate) must be > 0")
        for k in ("beta_1", "beta_2", "momentum"):
            if not 0 <= vals[k] < 1:
                raise ServerOptError(f"{name}: {k} must be in [0, 1), got {vals[k]}")
        if name != "fedavgm" and vals["tau"] <= 0:
            raise ServerOptError(
                f"{name}: tau must be > 0 (it keeps m / (sqrt(v) + tau) finite where v is 0)"
            )
        return cls(name=str(name), **vals)

    def to_json(self) -> dict[str, Any]:
        """The spec :meth:`from_json` reads back: the name and the settable hyperparameters."""
        return {"name": self.name, **{k: getattr(self, k) for k in SETTABLE[self.name]}}

    @property
    def state_names(self) -> tuple[str, ...]:
        """The vectors the optimizer keeps between rounds."""
        if self.name == "fedavgm":
            return ("momentum",) if self.momentum > 0 else ()
        return ("m", "v")

    def step(self, x: Vector, avg: Vector, state: MutableMapping[str, Vector], t: int) -> Vector:
        """The next global model from ``x`` and the round's FedAvg ``avg`` at round ``t``
        (1-based); ``state`` (empty before round 1) is updated in place."""
        if t < 1:
            raise ValueError("rounds count from 1")
        if self.name == "fedavgm":
            p = x - avg
            if self.momentum > 0:
                m = state.get("momentum")
                m = p if m is None or t == 1 else self.momentum * m + p
                state["momentum"] = m.astype(np.float32, copy=False)
                p = state["momentum"]
            return (x - np.float32(self.eta) * p).astype(np.float32, copy=False)
        d = avg - x
        zeros = np.zeros_like(x)
        m = state.get("m", zeros)
        v = state.get("v", zeros)
        m = np.float32(self.beta_1) * m + np.float32(1 - self.beta_1) * d
        d2 = d * d
        if self.name == "fedadam":
            v = (np.float32(self.beta_2) * v + np.float32(1 - self.beta_2) * d2).astype(np.float32)
            lr = self.eta * math.sqrt(1 - self.beta_2 ** (t + 1.0)) / (1 - self.beta_1 ** (t + 1.0))
        elif self.name == "fedyogi":
            v = v - np.float32(1 - self.beta_2) * d2 * np.sign(v - d2)
            lr = self.eta
        else:  # fedadagrad
            v = v + d2
            lr = self.eta
        state["m"], state["v"] = m.astype(np.float32), v.astype(np.float32)
        return (x + np.float32(lr) * m / (np.sqrt(v) + np.float32(self.tau))).astype(np.float32)


def state_to_safetensors(opt: ServerOptimizer, state: Mapping[str, Vector], round: int) -> bytes:
    """The optimizer's spec and state after ``round`` as one safetensors file (flat float32
    vectors named as :attr:`ServerOptimizer.state_names`), the checkpoint kept beside the
    round's model."""
    from safetensors.numpy import save

    meta = {METADATA_KEY: json.dumps(opt.to_json(), sort_keys=True), "round": str(round)}
    return save({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, meta)


def state_from_safetensors(data: bytes) -> tuple[ServerOptimizer, dict[str, Vector], int]:
    """``(optimizer, state, round)`` of a checkpoint written by :func:`state_to_safetensors`."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
        opt = ServerOptimizer.from_json(json.loads(meta[METADATA_KEY]))
        state = {k: v.astype(np.float32, copy=False) for k, v in load(data).items()}
        rnd = int(meta["round"])
    except (ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise ServerOptError(f"not a server optimizer checkpoint: {exc}") from None
    if state and set(state) != set(opt.state_names):  # none: before round 1
        raise ServerOptError(
            f"checkpoint holds {sorted(state)}, {opt.name} keeps {list(opt.state_names)}"
        )
    return opt, state, rnd
