"""Aggregation rules that are not sums (robust rules, central DP), split by coordinate range so
that shards run on separate endpoints.

A job names its rule in its initial weights' safetensors metadata (:data:`METADATA_KEY`, a
JSON object such as ``{"rule": "multi-krum", "f": 4}``; the SDK's ``submit_job(aggregation=...)``
writes it). Rules (``u_i``: client ``i``'s uploaded weights, ``g``: the model the round started
from, ``d_i = u_i - g``, ``n`` updates, ``s_i`` their sample counts):

- ``median``: coordinate-wise median of the ``u_i`` (Flower's FedMedian: sample counts ignored).
- ``trimmed-mean``: per coordinate, drop the ``floor(beta * n)`` smallest and largest values and
  average the rest (Flower's FedTrimmedAvg, ``beta`` its ``beta``).
- ``krum``: the update with the smallest Krum score, the sum of its ``n - f - 2`` smallest
  squared distances to the others (Blanchard et al. 2017; Flower's Krum with
  ``num_clients_to_keep=0``).
- ``multi-krum``: the ``m`` updates with the smallest scores (``m`` defaults to ``n - f``),
  averaged weighted by ``s_i`` (Flower's Krum with ``num_clients_to_keep=m``).
- ``fltrust``: the update of ``root_client`` is the server's own, trained on its clean root data
  set (Cao et al., NDSS 2021); it is not aggregated. Each other update gets the trust score
  ``TS_i = relu(cos(d_i, d_0))`` and is scaled to the root update's norm; the result is
  ``g + sum_i TS_i |d_0| / |d_i| d_i / sum_i TS_i`` (``g`` itself when every score is 0).
- ``dp-fedavg``: central differential privacy (DP-FedAvg, McMahan et al., ICLR 2018). Each
  delta is clipped to L2 norm ``clip`` (``C``), the clipped deltas are summed, Gaussian noise
  ``N(0, (z C)^2)`` per coordinate is added to the sum once (``z``: ``noise_multiplier``), and
  the sum is divided by the round's goal, the expected number of clients (a fixed denominator:
  a round closed with fewer updates is not scaled up); sample counts are ignored. Result:
  ``g + (sum_i min(1, C / |d_i|) d_i + N(0, (z C)^2 I)) / goal``. With equal sample counts and
  ``goal`` updates this is Flower's ``DifferentialPrivacyServerSideFixedClipping`` around
  FedAvg (its noise std ``z C / goal`` on the average). ``delta`` and ``epsilon`` (the budget)
  are the control plane's: it accounts each round (:mod:`core.privacy`). ``seed`` makes
  the noise reproducible and is recorded in ``meta.json`` (tests, audits): anyone reading it
  could take the noise out again, so a job with a budget (``epsilon``) may not set one;
  without it each round's generator is seeded from the OS's entropy and recorded nowhere.
  ``meta.json`` says how many updates were clipped, never a client's norm.

Median and trimmed mean need every update's slice of a coordinate range and nothing else, so a
shard computes its range of the result alone (:func:`reduce_order`). Krum, Multi-Krum, FLTrust
and DP-FedAvg need a global view first: each shard computes the Gram matrix ``d_i . d_j`` over its range
(:func:`gram_shard`), the partial matrices are summed (distances and norms are sums over
coordinates), the rule picks coefficients ``c_i`` (:func:`coefficients`), and each shard writes
``g + sum_i c_i d_i`` over its range (:func:`reduce_linear`). DP-FedAvg needs only the norms,
so its shards compute the Gram matrix's diagonal, and its linear pass adds the noise, each
shard over its range from a generator keyed by the round's seed and the range's first
coordinate (a shard sent again writes the same bytes). Results are the same for any number of
shards, up to float rounding of the summed Gram matrix (DP's noise: a different draw).

Pure functions over float32 vectors (read-only views of sealed store objects): no I/O.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core import wire

METADATA_KEY = "fedfaas.aggregation"
RULES = ("median", "trimmed-mean", "krum", "multi-krum", "fltrust", "dp-fedavg")
#: rules whose result is a linear combination chosen from the Gram matrix of the deltas
GRAM_RULES = frozenset({"krum", "multi-krum", "fltrust", "dp-fedavg"})
#: DP-FedAvg's default delta (the control plane's accounting)
DEFAULT_DELTA = 1e-5
#: coordinates per block inside a shard: a 20-update float64 block is 10 MiB
BLOCK = 1 << 16
MAX_SHARDS = 64

Vector = NDArray[np.float32]


class RuleError(ValueError):
    """An aggregation spec that is not valid (the message says what to change)."""


@dataclass(frozen=True)
class RobustRule:
    """One job's aggregation rule and its parameters (see the module)."""

    rule: str
    beta: float = 0.0
    f: int = 0
    m: int = 0
    root_client: str = ""
    #: DP-FedAvg: the clipping norm C, the noise multiplier z, the accountant's delta, the
    #: budget epsilon (None: accounted, never refused) and the noise seed (None: OS entropy)
    clip: float = 0.0
    noise_multiplier: float = 0.0
    delta: float = 0.0
    epsilon: float | None = None
    seed: int | None = None
    #: coordinate shards (tasks for aggregator endpoints); 0: one per registered endpoint
    shards: int = 0

    @classmethod
    def from_json(cls, raw: Any) -> RobustRule:
        """``{"rule": "trimmed-mean", "beta": 0.2}``, ``{"rule": "krum", "f": 4}``,
        ``{"rule": "multi-krum", "f": 4, "m": 10}``, ``{"rule": "fltrust", "root_client": "c0"}``,
        ``{"rule": "dp-fedavg", "clip": 1.0, "noise_multiplier": 1.1, "delta": 1e-5,
        "epsilon": 8.0, "seed": 7}`` (``delta``, ``epsilon``, ``seed`` optional) or
        ``{"rule": "median"}``; each may add ``"shards": S``."""
        if not isinstance(raw, Mapping):
            raise RuleError("the aggregation spec must be a JSON object with a 'rule'")
        rule = raw.get("rule")
        if rule not in RULES:
            raise RuleError(f"aggregation rule {rule!r} unknown; one of {', '.join(RULES)}")
        takes = {
            "median": (),
            "trimmed-mean": ("beta",),
            "krum": ("f",),
            "multi-krum": ("f", "m"),
            "fltrust": ("root_client",),
            "dp-fedavg": ("clip", "noise_multiplier", "delta", "epsilon", "seed"),
        }[rule]
        extra = set(raw) - {"rule", "shards", *takes}
        if extra:
            said = ", ".join(takes) if takes else "no parameters"
            raise RuleError(f"{rule} takes {said} (and shards); not {', '.join(sorted(extra))}")
        shards = _int(raw, "shards", 0)
        if not 0 <= shards <= MAX_SHARDS:
            raise RuleError(f"shards must be in 0..{MAX_SHARDS} (0: one per endpoint)")
        beta = raw.get("beta", 0.1 if rule == "trimmed-mean" else 0.0)
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta < 0.5:
            raise RuleError(f"trimmed-mean: beta must be a number in [0, 0.5), got {beta!r}")
        f = _int(raw, "f", 1 if rule in ("krum", "multi-krum") else 0)
        if f < 0:
            raise RuleError(f"{rule}: f (malicious clients tolerated) must be >= 0")
        m = _int(raw, "m", 0)
        if m < 0:
            raise RuleError("multi-krum: m (updates averaged) must be >= 0 (0: n - f)")
        root = raw.get("root_client", "")
        if rule == "fltrust" and (not isinstance(root, str) or not root):
            raise RuleError("fltrust needs root_client: the client whose update is the server's")
        if rule != "dp-fedavg":
            return cls(str(rule), beta=float(beta), f=f, m=m, root_client=str(root), shards=shards)
        return cls(str(rule), shards=shards, **_dp_params(raw))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule}
        if self.rule == "trimmed-mean":
            out["beta"] = self.beta
        if self.rule in ("krum", "multi-krum"):
            out["f"] = self.f
        if self.rule == "multi-krum":
            out["m"] = self.m
        if self.rule == "fltrust":
            out["root_client"] = self.root_client
        if self.rule == "dp-fedavg":
            out.update(clip=self.clip, noise_multiplier=self.noise_multiplier, delta=self.delta)
            if self.epsilon is not None:
                out["epsilon"] = self.epsilon
            if self.seed is not None:
                out["seed"] = self.seed
        if self.shards:
            out["shards"] = self.shards
        return out

    @property
    def uses_gram(self) -> bool:
        return self.rule in GRAM_RULES

    @property
    def norms_only(self) -> bool:
        """The rule reads only the Gram matrix's diagonal (the deltas' squared norms)."""
        return self.rule == "dp-fedavg"

    def check_count(self, n: int) -> None:
        """Raise :class:`RuleError` when ``n`` updates are too few for the rule."""
        if n < 1:
            raise RuleError("no updates to aggregate")
        if self.rule in ("krum", "multi-krum") and n < self.f + 3:
            raise RuleError(f"{self.rule} with f={self.f} needs at least {self.f + 3} updates")
        if self.rule == "multi-krum" and self.m > n:
            raise RuleError(f"multi-krum: m={self.m} is more than the {n} updates")


def declared(weights: bytes | memoryview) -> RobustRule | None:
    """The rule initial weights declare in ``__metadata__[METADATA_KEY]`` (None: FedAvg).

    Raises :class:`RuleError` for a bad spec and ``wire.WireError`` for a bad header."""
    _, start = wire.parse_raw_header(weights, wire.DEFAULT_MAX_HEADER)
    meta = json.loads(bytes(weights[8:start])).get("__metadata__") or {}
    raw = meta.get(METADATA_KEY)
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
    except ValueError as exc:
        raise RuleError(f"__metadata__[{METADATA_KEY!r}] is not JSON: {exc}") from None
    return RobustRule.from_json(spec)


def _dp_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    """DP-FedAvg's parameters from its spec (see :meth:`RobustRule.from_json`)."""

    def number(key: str, default: float | None) -> float | None:
        v = raw.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise RuleError(f"dp-fedavg: {key} must be a finite number, got {v!r}")
        return float(v)

    if "clip" not in raw or "noise_multiplier" not in raw:
        raise RuleError(
            "dp-fedavg needs clip (the L2 norm each update's delta is clipped to) and "
            "noise_multiplier (the noise's std as a multiple of clip)"
        )
    clip, z = number("clip", None), number("noise_multiplier", None)
    delta, eps = number("delta", DEFAULT_DELTA), number("epsilon", None)
    if clip is None or clip <= 0:
        raise RuleError(f"dp-fedavg: clip must be > 0, got {clip!r}")
    if z is None or z < 0:
        raise RuleError(f"dp-fedavg: noise_multiplier must be >= 0, got {z!r}")
    if delta is None or not 0 < delta < 1:
        raise RuleError(f"dp-fedavg: delta must be in (0, 1), got {delta!r}")
    if eps is not None and eps <= 0:
        raise RuleError(f"dp-fedavg: epsilon (the privacy budget) must be > 0, got {eps!r}")
    if eps is not None and z == 0:
        raise RuleError("dp-fedavg: noise_multiplier 0 adds no noise: no epsilon budget holds")
    seed = raw.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 128
    ):
        raise RuleError(f"dp-fedavg: seed must be an integer in [0, 2^128), got {seed!r}")
    if seed is not None and eps is not None:
        raise RuleError(
            "dp-fedavg: a seed makes the noise reproducible from meta.json (tests, audits), "
            "which no privacy budget survives: set epsilon or seed, not both"
        )
    return {"clip": clip, "noise_multiplier": z, "delta": delta, "epsilon": eps, "seed": seed}


def _int(raw: Mapping[str, Any], key: str, default: int) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise RuleError(f"{key} must be an integer, got {v!r}")
    return int(v)


def shard_bounds(n_coords: int, shards: int) -> list[int]:
    """``shards + 1`` boundaries splitting ``[0, n_coords)`` into near-equal ranges, each a
    multiple of 16 coordinates (one 64-byte cache line of float32) except the last."""
    shards = max(1, min(shards, max(1, n_coords // 16)))
    step = -(-n_coords // shards)
    step = -(-step // 16) * 16
    out = [min(i * step, n_coords) for i in range(shards)]
    return [*out, n_coords]


# -- shard kernels (run on an aggregator endpoint) -----------------------------------------------


@functools.cache
def sorting_network(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort for ``n`` rows: compare-exchange pairs ``(i, j)``, ``i < j``
    (min to ``i``). Built for the next power of two; pairs reaching past ``n`` are left out,
    as rows there would hold +inf and never move."""
    size = 1 << max(0, (n - 1).bit_length())
    pairs = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    a, b = i + j, i + j + k
                    if a // (2 * p) == b // (2 * p) and b < n:
                        pairs.append((a, b))
            k //= 2
        p *= 2
    return tuple(pairs)


#: up to this many updates a block is sorted by the network (two vector ops per pair over
#: contiguous rows); beyond it, by numpy's partition along the column
NETWORK_MAX = 64


def reduce_order(
    rule: RobustRule, updates: Sequence[Vector], lo: int, hi: int, out: Vector
) -> None:
    """Median or trimmed mean of ``updates[i][lo:hi]`` into ``out[lo:hi]`` (block by block).

    Up to :data:`NETWORK_MAX` updates, each block's rows are sorted per coordinate by
    :func:`sorting_network` (``np.minimum``/``np.maximum`` over whole rows: no per-coordinate
    call); the median is then ``(s[(n-1)//2] + s[n//2]) / 2`` in float32, as ``np.median``."""
    n = len(updates)
    width = min(BLOCK, max(hi - lo, 1))
    block = np.empty((n + 1, width), dtype=np.float32)
    cut = int(rule.beta * n)
    net = sorting_network(n) if n <= NETWORK_MAX else None
    for a in range(lo, hi, BLOCK):
        b = min(a + BLOCK, hi)
        rows = [block[i, : b - a] for i in range(n)]
        for i, u in enumerate(updates):
            rows[i][...] = u[a:b]
        if net is not None:
            spare = block[n, : b - a]
            for i, j in net:
                np.minimum(rows[i], rows[j], out=spare)
                np.maximum(rows[i], rows[j], out=rows[j])
                rows[i], spare = spare, rows[i]
            if rule.rule == "median":
                np.add(rows[(n - 1) // 2], rows[n // 2], out=out[a:b])
                out[a:b] *= np.float32(0.5)
            else:
                acc = out[a:b]
                acc[...] = rows[cut]
                for r in rows[cut + 1 : n - cut]:
                    acc += r
                acc /= np.float32(n - 2 * cut)
            continue
        buf = block[:n, : b - a]
        if rule.rule == "median":
            np.median(buf, axis=0, out=out[a:b], overwrite_input=True)
        else:
            buf.partition((cut, n - cut - 1), axis=0)
            np.mean(buf[cut : n - cut], axis=0, out=out[a:b])


def gram_shard(
    updates: Sequence[Vector], g: Vector, lo: int, hi: int, *, diagonal: bool = False
) -> NDArray[np.float64]:
    """``G[i, j] = sum_{k in [lo, hi)} (u_i - g)_k (u_j - g)_k``, in float64; with
    ``diagonal`` only ``G[i, i]`` (the squared norms; zeros elsewhere)."""
    n = len(updates)
    out = np.zeros((n, n), dtype=np.float64)
    block = np.empty((n, min(BLOCK, max(hi - lo, 1))), dtype=np.float64)
    for a in range(lo, hi, BLOCK):
        b = min(a + BLOCK, hi)
        buf = block[:, : b - a]
        base = g[a:b]
        for i, u in enumerate(updates):
            np.subtract(u[a:b], base, out=buf[i])
        if diagonal:
            out[np.diag_indices(n)] += np.einsum("ij,ij->i", buf, buf)
        else:
            out += buf @ buf.T
    return out


@dataclass(frozen=True)
class Noise:
    """Gaussian noise a linear pass adds: ``std`` per coordinate, drawn by each shard from
    ``numpy.random.PCG64`` seeded with ``SeedSequence(seed, spawn_key=(first coordinate,))``."""

    std: float
    seed: int

    def generator(self, lo: int) -> np.random.Generator:
        seq = np.random.SeedSequence(self.seed, spawn_key=(lo,))
        return np.random.Generator(np.random.PCG64(seq))


def reduce_linear(
    coef: NDArray[np.float64],
    updates: Sequence[Vector],
    g: Vector,
    lo: int,
    hi: int,
    out: Vector,
    noise: Noise | None = None,
) -> None:
    """``out[lo:hi] = g + sum_i coef_i (u_i - g)`` over the range (float64 per block), plus
    ``noise`` when given."""
    acc = np.empty(min(BLOCK, max(hi - lo, 1)), dtype=np.float64)
    rest = 1.0 - float(coef.sum())
    rng = noise.generator(lo) if noise is not None and noise.std > 0 else None
    for a in range(lo, hi, BLOCK):
        b = min(a + BLOCK, hi)
        buf = acc[: b - a]
        np.multiply(g[a:b], rest, out=buf)
        for c, u in zip(coef, updates, strict=True):
            if c != 0.0:
                buf += c * u[a:b].astype(np.float64)
        if rng is not None:
            assert noise is not None
            buf += noise.std * rng.standard_normal(b - a)
        out[a:b] = buf


# -- the global step between the two passes (run by the gateway) ---------------------------------


def krum_scores(d2: NDArray[np.float64], f: int) -> NDArray[np.float64]:
    """Krum score of each row: sum of its ``n - f - 2`` smallest squared distances to the others."""
    n = d2.shape[0]
    k = n - f - 2
    if k < 1:
        raise ValueError(f"Krum needs n >= f + 3; got n={n}, f={f}")
    off = d2.copy()
    np.fill_diagonal(off, np.inf)
    return np.asarray(np.sort(off, axis=1)[:, :k].sum(axis=1), dtype=np.float64)


@dataclass(frozen=True)
class Choice:
    """What a Gram rule decided: the coefficients of the deltas and why (for ``meta.json``)."""

    coef: NDArray[np.float64]
    #: per input: ``selected`` (Krum), ``trust`` (FLTrust); ``scores`` (Krum)
    detail: dict[str, Any]


def coefficients(
    rule: RobustRule,
    gram: NDArray[np.float64],
    samples: Sequence[float],
    root: int | None = None,
    expected: int = 0,
) -> Choice:
    """Coefficients of the deltas from their Gram matrix (see the module).

    ``samples`` weights Multi-Krum's average; ``root`` is the index of FLTrust's root update
    (None when it did not arrive: every score is then 0 and the model stays as it was);
    ``expected`` is DP-FedAvg's denominator, the round's goal (0: the updates' count).
    """
    n = gram.shape[0]
    diag = np.clip(np.diag(gram), 0.0, None)
    if rule.rule == "dp-fedavg":
        norms = np.sqrt(diag)
        scale = np.minimum(1.0, rule.clip / np.where(norms > 0, norms, np.inf))
        denom = expected if expected > 0 else n
        return Choice(
            scale / denom,
            {
                "norms": norms.tolist(),
                "clipped": [i for i in range(n) if norms[i] > rule.clip],
                "denominator": denom,
                "noise_std": rule.noise_multiplier * rule.clip / denom,
            },
        )
    if rule.rule in ("krum", "multi-krum"):
        d2 = np.clip(diag[:, None] + diag[None, :] - 2.0 * gram, 0.0, None)
        np.fill_diagonal(d2, 0.0)
        scores = krum_scores(d2, rule.f)
        keep = 1 if rule.rule == "krum" else (rule.m or n - rule.f)
        chosen = np.argsort(scores, kind="stable")[:keep]
        coef = np.zeros(n)
        s = np.asarray(samples, dtype=np.float64)
        if keep == 1:
            coef[chosen] = 1.0
        else:
            coef[chosen] = s[chosen] / s[chosen].sum()
        return Choice(coef, {"scores": scores.tolist(), "selected": sorted(chosen.tolist())})
    if rule.rule == "fltrust":
        coef = np.zeros(n)
        trust = np.zeros(n)
        if root is not None and diag[root] > 0:
            norms = np.sqrt(diag)
            with np.errstate(divide="ignore", invalid="ignore"):
                cos = np.where(norms > 0, gram[root] / (norms * norms[root]), 0.0)
            trust = np.maximum(cos, 0.0)
            trust[root] = 0.0
            total = trust.sum()
            if total > 0:
                scale = np.where(norms > 0, norms[root] / np.where(norms > 0, norms, 1.0), 0.0)
                coef = trust * scale / total
        return Choice(coef, {"trust": trust.tolist(), "root": root})
    raise RuleError(f"{rule.rule} does not use a Gram matrix")


# -- references: the whole rule over whole vectors, for tests and benchmarks ------------------


def reference(
    rule: RobustRule,
    updates: Sequence[Vector],
    g: Vector,
    samples: Sequence[float],
    root: int | None = None,
    expected: int = 0,
) -> NDArray[np.float64]:
    """The rule computed directly on stacked vectors (no shards, no Gram matrix); DP-FedAvg's
    without its noise."""
    x = np.stack([np.asarray(u, dtype=np.float64) for u in updates])
    n = x.shape[0]
    if rule.rule == "median":
        return np.asarray(np.median(x, axis=0), dtype=np.float64)
    if rule.rule == "trimmed-mean":
        cut = int(rule.beta * n)
        return np.asarray(np.sort(x, axis=0)[cut : n - cut].mean(axis=0), dtype=np.float64)
    d = x - np.asarray(g, dtype=np.float64)
    if rule.rule == "dp-fedavg":
        clipped = [di * min(1.0, rule.clip / float(np.linalg.norm(di) or np.inf)) for di in d]
        total = np.sum(clipped, axis=0) / (expected or n)
        return np.asarray(np.asarray(g, np.float64) + total, dtype=np.float64)
    if rule.rule in ("krum", "multi-krum"):
        d2 = ((d[:, None, :] - d[None, :, :]) ** 2).sum(axis=2)
        scores = [np.sort(np.delete(d2[i], i))[: n - rule.f - 2].sum() for i in range(n)]
        keep = 1 if rule.rule == "krum" else (rule.m or n - rule.f)
        chosen = np.argsort(scores, kind="stable")[:keep]
        s = np.asarray(samples, dtype=np.float64)[chosen]
        mean = (d[chosen] * s[:, None]).sum(axis=0) / s.sum()
        return np.asarray(np.asarray(g, np.float64) + mean, dtype=np.float64)
    assert rule.rule == "fltrust"
    base = np.asarray(g, dtype=np.float64)
    if root is None:
        return base
    d0 = d[root]
    n0 = float(np.linalg.norm(d0))
    acc = np.zeros_like(base)
    total = 0.0
    for i in range(n):
        ni = float(np.linalg.norm(d[i]))
        if i == root or ni == 0 or n0 == 0:
            continue
        ts = max(float(d[i] @ d0) / (ni * n0), 0.0)
        acc += ts * d[i] * (n0 / ni)
        total += ts
    return base if total == 0 else base + acc / total


def far(a: NDArray[np.floating], b: NDArray[np.floating]) -> float:
    """``|a - b| / |b|``: how far a result is from a reference vector (the closing note's metric)."""
    nb = float(np.linalg.norm(np.asarray(b, np.float64)))
    diff = float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
    return diff / nb if nb else math.inf if diff else 0.0
