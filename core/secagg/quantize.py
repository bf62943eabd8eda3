"""Clip and quantize updates into Z_2^32, and dequantize sums of them.

A client sends ``[q(r * x), round(r * L)]``: its update ``x`` clipped to ``[-c, c]`` and
scaled by its weight ``r`` in ``(0, 1]``, mapped onto ``0..L`` (``L = 2**bits - 1`` levels),
then its weight itself on ``0..L``. Sums of ``n`` such vectors stay below ``n * L < 2**32``,
so the sum in Z_2^32 is the integer sum, and the weighted FedAvg is
``(S_x * 2c / L - n c) / (S_r / L)``, within ``c / L`` of the FedAvg of the clipped updates
for each coordinate (rounding to nearest: half a step per client, and the weights' own
rounding). Deterministic rounding keeps the result reproducible from the clients' vectors.
"""

from __future__ import annotations

import numpy as np

from .config import SecAggConfig

UINT = np.uint32


def weight_ratio(cfg: SecAggConfig, n_samples: int) -> float:
    """A client's weight in ``(0, 1]``: ``min(n_samples, max_weight) / max_weight``."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, not {n_samples}")
    return min(n_samples, cfg.max_weight) / cfg.max_weight


def quantize(cfg: SecAggConfig, update: np.ndarray, n_samples: int) -> np.ndarray:
    """The uint32 vector (one longer than ``update``: its weight last) a client masks.

    float32 arithmetic, in place (a ResNet-18 update in tens of milliseconds): its rounding
    moves a value by far less than a step, which :func:`error_bound` allows for."""
    x = np.asarray(update).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError("the update has NaN or Inf values")
    ratio = weight_ratio(cfg, n_samples)
    c, levels = cfg.clip, cfg.levels
    scaled = np.clip(x, -c, c, dtype=np.float32)
    scaled *= np.float32(ratio)
    scaled += np.float32(c)
    scaled *= np.float32(levels / (2 * c))
    np.rint(scaled, out=scaled)
    np.clip(scaled, 0, levels, out=scaled)  # float32 rounding must not leave 0..levels
    out = np.empty(x.size + 1, dtype=UINT)
    out[:-1] = scaled
    out[-1] = max(1, round(ratio * levels))
    return out


def dequantize(cfg: SecAggConfig, total: np.ndarray, n_clients: int) -> np.ndarray:
    """Weighted FedAvg (float32) from the unmasked sum of ``n_clients`` quantized vectors."""
    s = np.asarray(total, dtype=UINT)
    c, levels = cfg.clip, cfg.levels
    weight = float(s[-1]) / levels
    if weight <= 0:
        raise ValueError("the sum carries no weight: not a sum of quantized updates")
    sums = s[:-1].astype(np.float64) * (2 * c / levels) - n_clients * c
    return (sums / weight).astype(np.float32)


def error_bound(cfg: SecAggConfig, n_clients: int, weight_sum: float) -> float:
    """Largest difference per coordinate between :func:`dequantize`'s result and the weighted
    FedAvg of the clipped updates, from rounding alone, for ``n_clients`` whose quantized
    weights sum to ``weight_sum`` (the sum's last coordinate over ``levels``): each value is
    within one step ``2c / L`` of ``r x`` (half a step from rounding to nearest, a little
    more from float32), each weight within ``1 / 2L`` of ``r``, and the mean is at most ``c``
    in size, so the error is at most ``2.5 n c / (L W)``."""
    return 2.5 * n_clients * cfg.clip / (cfg.levels * weight_sum)
