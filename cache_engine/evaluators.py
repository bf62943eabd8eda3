"""Validation-set evaluators named by a job's metadata, built where a workload needs one.

A job declares its evaluator in round 0's ``round_meta["evaluator"]`` (a small JSON spec, never
code). Kinds:

- ``digits-softmax``: softmax regression (``bias`` (10), ``weight`` (10 x 64), sorted-name order)
  on the held-out part of scikit-learn's bundled ``load_digits`` (no download); utility = accuracy.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray


class EvaluatorUnavailable(ValueError):
    """The spec names no evaluator this build knows."""


def digits_split(
    seed: int = 0, val_fraction: float = 0.3
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """``load_digits`` scaled to [0, 1], split into train and validation (deterministic)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_val = int(len(y) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return x[train], y[train].astype(np.int64), x[val], y[val].astype(np.int64)


@lru_cache(maxsize=8)
def _build(spec_json: str) -> Any:
    spec = json.loads(spec_json)
    kind = spec.get("kind")
    if kind == "digits-softmax":
        import torch

        from fedfaas.workloads import TorchEvaluator

        _, _, xv, yv = digits_split(int(spec.get("split_seed", 0)))
        module = torch.nn.Linear(64, 10)
        return TorchEvaluator(module, xv, yv, names=["bias", "weight"])
    raise EvaluatorUnavailable(f"unknown evaluator kind {kind!r}; known: digits-softmax")


def build_evaluator(spec: dict[str, Any] | None) -> Any:
    """The evaluator ``spec`` names (cached per spec), or None without a spec."""
    if not spec:
        return None
    if not isinstance(spec, dict):
        raise EvaluatorUnavailable("an evaluator spec must be a JSON object")
    return _build(json.dumps(spec, sort_keys=True))
