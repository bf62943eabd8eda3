"""Local training and evaluation (plain PyTorch SGD on a client's shard)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one client's local update."""

    epochs: int = 3
    batch_size: int = 8
    lr: float = 0.05
    momentum: float = 0.9


@dataclass(frozen=True)
class TrainResult:
    """``mean_loss``: mean of the batch losses; ``loss_sq_mean``: mean squared per-sample loss
    over every sample seen (Oort's statistical utility is ``n * sqrt(loss_sq_mean)``)."""

    num_samples: int
    steps: int
    mean_loss: float
    loss_sq_mean: float = 0.0


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    loss: float
    num_samples: int


def train_local(
    model: nn.Module, x: np.ndarray, y: np.ndarray, config: TrainConfig, seed: int = 0
) -> TrainResult:
    """Run ``config.epochs`` epochs of mini-batch SGD on ``(x, y)`` in place.

    The batch order comes from ``seed`` so a client's update is reproducible.
    """
    if len(y) == 0:
        raise ValueError("cannot train on an empty shard")
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    gen = torch.Generator().manual_seed(seed)
    model.train()
    total, steps, sq, seen = 0.0, 0, 0.0, 0
    for _ in range(config.epochs):
        order = torch.randperm(len(yt), generator=gen)
        for start in range(0, len(yt), config.batch_size):
            batch = order[start : start + config.batch_size]
            opt.zero_grad(set_to_none=True)
            per_sample = loss_fn(model(xt[batch]), yt[batch])
            loss = per_sample.mean()
            loss.backward()
            opt.step()
            total += float(loss.detach())
            sq += float((per_sample.detach() ** 2).sum())
            seen += len(batch)
            steps += 1
    return TrainResult(
        num_samples=len(yt),
        steps=steps,
        mean_loss=total / max(steps, 1),
        loss_sq_mean=sq / max(seen, 1),
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> EvalResult:
    """Accuracy and mean cross-entropy of ``model`` on ``(x, y)``."""
    model.eval()
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    logits = model(xt)
    loss = float(nn.functional.cross_entropy(logits, yt))
    acc = float((logits.argmax(1) == yt).float().mean())
    return EvalResult(accuracy=acc, loss=loss, num_samples=len(yt))


def fedavg_state_dicts(
    states: list[dict[str, torch.Tensor]], weights: list[float]
) -> dict[str, torch.Tensor]:
    """Sample-weighted average of state dicts (the reference the gateway's result must match)."""
    if not states or len(states) != len(weights):
        raise ValueError("need one weight per state dict, and at least one")
    total = float(sum(weights))
    out: dict[str, torch.Tensor] = {}
    for name in states[0]:
        acc = torch.zeros_like(states[0][name], dtype=torch.float64)
        for s, w in zip(states, weights, strict=True):
            acc += s[name].to(torch.float64) * (w / total)
        out[name] = acc.to(states[0][name].dtype)
    return out
