"""FedAvg as pure math on flat float32 vectors: partials are sums, never averages.

Every node of an aggregation tree holds ``(S, W, n)`` with ``S = sum_k c_k * w_k`` (float32,
usually a tensor viewing a shared-memory object), ``W = sum_k c_k`` and ``n`` the number of
client updates folded. Children merge into parents by plain addition, and only the top divides,
once: ``S / W``. So any tree gives exactly flat FedAvg, unlike the public LIFL code whose running
``rate = c / total`` over-weights early arrivals.

Two kernels, one pass over memory each, chosen by the type of the accumulator:

- torch tensors: ``torch.Tensor.add_(other, alpha=c)``, one fused pass, no temporaries;
- numpy arrays: BLAS ``saxpy`` (through ``scipy.linalg.blas``, in place, one pass), or where
  scipy is missing the same axpy in cache-sized blocks (``multiply`` into a 128 KiB scratch,
  then ``add`` in place). It avoids importing torch, whose CUDA-enabled build costs ~300 MB of
  private memory per aggregator process (scipy's BLAS wrappers cost ~30 MB).

The first fold writes with ``mul(out=)`` so accumulators need no zeroing pass. torch is
imported only when a torch tensor is passed.

The numpy kernels take ``threads``: the vectors are cut into that many coordinate ranges, folded
at once (numpy and BLAS run without the GIL). A fold is bound by memory bandwidth, so this helps
as far as one core cannot use the node's bandwidth alone: the top aggregator, which runs alone
at the round's tail, uses it. The top's last fold also divides in the same pass
(:meth:`Accumulator.merge_into` and :meth:`Accumulator.merge` with ``final=True``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any

import numpy as np

from core.parallel import run_all

Vector = Any  # torch.Tensor or np.ndarray (float32, same length)
BLOCK = 1 << 15  # elements per numpy block: 128 KiB, stays in L2


def _is_torch(x: object) -> bool:
    return type(x).__module__.startswith("torch")


def as_tensor(x: Vector) -> Any:
    """A torch view of ``x`` (no copy for numpy arrays, including read-only shared memory)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


#: coordinates below which a kernel never splits (threads cost more than they save)
MIN_SPLIT = 1 << 18


def _split(threads: int, fn: Callable[..., None], *vecs: np.ndarray) -> None:
    """Run ``fn`` over ``threads`` coordinate ranges of the flat ``vecs`` at once
    (:func:`core.parallel.run_all`); one call when ``threads`` is 1 or the vectors are small."""
    n = vecs[0].size
    k = max(1, min(int(threads), n // MIN_SPLIT))
    bounds = [n * i // k for i in range(k + 1)]
    run_all([partial(fn, *(v[bounds[i] : bounds[i + 1]] for v in vecs)) for i in range(k)])


def _flat_np(*xs: Vector) -> list[np.ndarray]:
    arrs = [np.asarray(x) for x in xs]
    if len({a.shape for a in arrs}) != 1:
        raise ValueError(f"shapes differ: {', '.join(str(a.shape) for a in arrs)}")
    return [a.reshape(-1) for a in arrs]


def accumulate(
    acc: Vector, update: Vector, weight: float, *, first: bool = False, threads: int = 1
) -> None:
    """``acc += weight * update`` in one pass (``acc = weight * update`` when ``first``)."""
    w = float(weight)
    if _is_torch(acc) or _is_torch(update):
        import torch

        a, u = as_tensor(acc), as_tensor(update)
        if first:
            torch.mul(u, w, out=a)
        else:
            a.add_(u, alpha=w)
        return
    a_flat, u_flat = _flat_np(acc, update)
    if first:
        _split(threads, lambda a, u: np.multiply(u, np.float32(w), out=a), a_flat, u_flat)
        return
    _split(threads, lambda a, u: _axpy(a, u, w), a_flat, u_flat)


def _axpy(a_flat: np.ndarray, u_flat: np.ndarray, w: float) -> None:
    """``a += w * u`` on flat float32 arrays: BLAS saxpy, else cache-sized blocks."""
    if w == 1.0:
        np.add(a_flat, u_flat, out=a_flat)
        return
    saxpy = _blas_saxpy()
    if (
        saxpy is not None
        and a_flat.dtype == np.float32
        and u_flat.dtype == np.float32
        and a_flat.flags.c_contiguous
        and a_flat.flags.writeable
        and u_flat.flags.c_contiguous
    ):
        out = saxpy(u_flat, a_flat, a=w)
        if np.shares_memory(out, a_flat):
            return
        a_flat[...] = out  # pragma: no cover - f2py copied; keep the result anyway
        return
    tmp = np.empty(min(BLOCK, a_flat.size), np.float32)
    for i in range(0, a_flat.size, BLOCK):
        blk = a_flat[i : i + BLOCK]
        t = tmp[: blk.size]
        np.multiply(u_flat[i : i + BLOCK], np.float32(w), out=t)
        np.add(blk, t, out=blk)


def add_into(
    out: Vector, a: Vector, b: Vector, *, divide_by: float | None = None, threads: int = 1
) -> None:
    """``out = a + b`` in one pass (``a`` and ``b`` are only read); with ``divide_by``,
    ``out = (a + b) / divide_by`` in the same pass (cache-sized blocks)."""
    if _is_torch(out) or _is_torch(a) or _is_torch(b):
        import torch

        o = as_tensor(out)
        torch.add(as_tensor(a), as_tensor(b), out=o)
        if divide_by is not None:
            o.div_(float(divide_by))
        return
    o, x, y = _flat_np(out, a, b)
    if divide_by is None:
        _split(threads, lambda o_, x_, y_: np.add(x_, y_, out=o_), o, x, y)
        return
    d = np.float32(divide_by)

    def add_divide(o_: np.ndarray, x_: np.ndarray, y_: np.ndarray) -> None:
        for i in range(0, o_.size, BLOCK):
            blk = o_[i : i + BLOCK]
            np.add(x_[i : i + BLOCK], y_[i : i + BLOCK], out=blk)
            np.divide(blk, d, out=blk)

    _split(threads, add_divide, o, x, y)


_SAXPY: list[Any] = []


def preload() -> None:
    """Import the BLAS kernel now (scipy, about 0.4 s), so a warm aggregator's first fold
    does not pay it inside a round."""
    _blas_saxpy()


def _blas_saxpy() -> Any:
    """scipy's BLAS ``saxpy`` (y = a*x + y in place), or None without scipy."""
    if not _SAXPY:
        try:
            from scipy.linalg.blas import saxpy
        except ImportError:  # pragma: no cover - scikit-learn brings scipy
            saxpy = None
        _SAXPY.append(saxpy)
    return _SAXPY[0]


def finalize(acc: Vector, weight_sum: float, out: Vector | None = None, *, threads: int = 1) -> Any:
    """Divide the weighted sum by the weight sum, once (in place unless ``out`` is given)."""
    if weight_sum <= 0:
        raise ValueError(f"weight sum must be positive, got {weight_sum}")
    if _is_torch(acc):
        import torch

        a = as_tensor(acc)
        if out is None:
            return a.div_(float(weight_sum))
        o = as_tensor(out)
        torch.div(a, float(weight_sum), out=o)
        return o
    target = acc if out is None else out
    d = np.float32(weight_sum)
    src, dst = _flat_np(acc, target)
    _split(threads, lambda s_, t_: np.divide(s_, d, out=t_), src, dst)
    return target


@dataclass
class Accumulator:
    """Eager accumulator ``(S, W, n)`` over a caller-owned float32 vector ``acc``.

    ``add`` folds a client update (weight = sample count); ``merge`` folds a child's partial
    sum (already weighted); ``finalize`` divides once. A merge with ``final=True`` divides in
    the same pass (the top's last fold): :attr:`final` is then set and ``finalize`` does
    nothing more. ``threads``: coordinate ranges folded at once (see the module).
    """

    acc: Vector
    weight: float = 0.0
    count: int = 0
    _empty: bool = field(default=True, repr=False)
    threads: int = 1
    final: bool = False

    def _check_open(self) -> None:
        if self.final:
            raise ValueError("this accumulator holds a final average; nothing more folds in")

    def add(self, update: Vector, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"sample count must be positive, got {weight}")
        self._check_open()
        accumulate(self.acc, update, weight, first=self._empty, threads=self.threads)
        self._empty = False
        self.weight += float(weight)
        self.count += 1

    def merge(self, partial_sum: Vector, weight: float, count: int, *, final: bool = False) -> None:
        self._check_open()
        total = self.weight + float(weight)
        if final and not self._empty:
            add_into(self.acc, self.acc, partial_sum, divide_by=total, threads=self.threads)
        else:
            accumulate(self.acc, partial_sum, 1.0, first=self._empty, threads=self.threads)
            if final:
                finalize(self.acc, total, threads=self.threads)
        self._empty = False
        self.weight = total
        self.count += int(count)
        self.final = final

    def merge_into(
        self, out: Vector, partial_sum: Vector, weight: float, count: int, *, final: bool = False
    ) -> Accumulator:
        """A new accumulator over ``out`` holding this one plus a partial, in one pass (divided
        by the new weight sum in the same pass when ``final``); this one's vector is only read
        (it may be sealed)."""
        self._check_open()
        total = self.weight + float(weight)
        if self._empty:
            accumulate(out, partial_sum, 1.0, first=True, threads=self.threads)
            if final:
                finalize(out, total, threads=self.threads)
        else:
            divide = total if final else None
            add_into(out, self.acc, partial_sum, divide_by=divide, threads=self.threads)
        return Accumulator(
            out, total, self.count + int(count), _empty=False, threads=self.threads, final=final
        )

    def finalize(self, out: Vector | None = None) -> Any:
        if self.final:
            if out is not None:
                raise ValueError("the average is final already; it is not written elsewhere")
            return self.acc
        self.final = True
        return finalize(self.acc, self.weight, out, threads=self.threads)


@dataclass
class LazyAccumulator:
    """Lazy variant: remembers the inputs and folds them all when ``fold`` is called."""

    acc: Vector
    updates: list[tuple[Vector, float]] = field(default_factory=list)
    partials: list[tuple[Vector, float, int]] = field(default_factory=list)

    def add(self, update: Vector, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"sample count must be positive, got {weight}")
        self.updates.append((update, float(weight)))

    def merge(self, partial_sum: Vector, weight: float, count: int) -> None:
        self.partials.append((partial_sum, float(weight), int(count)))

    @property
    def count(self) -> int:
        return len(self.updates) + sum(c for _, _, c in self.partials)

    @property
    def weight(self) -> float:
        return sum(w for _, w in self.updates) + sum(w for _, w, _ in self.partials)

    def fold(self) -> Accumulator:
        eager = Accumulator(self.acc)
        for u, w in self.updates:
            eager.add(u, w)
        for s, w, c in self.partials:
            eager.merge(s, w, c)
        return eager


# -- references the tests and benchmarks compare against ---------------------------------------


def fedavg_reference(updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Flat FedAvg in float64 with ``np.average`` (the slow, obvious reference)."""
    return np.average(
        np.stack([np.asarray(u, np.float64) for u in updates]),
        axis=0,
        weights=np.asarray(weights, np.float64),
    )


def flower_aggregate(results: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
    """Flower's ``flwr.server.strategy.aggregate.aggregate``, same formula and order.

    Multiplies each layer by its client's example count, sums with ``reduce(np.add)`` and
    divides by the total count (used where ``flwr`` is not importable).
    """
    num_examples_total = sum(num_examples for (_, num_examples) in results)
    weighted_weights = [
        [layer * num_examples for layer in weights] for weights, num_examples in results
    ]
    weights_prime: list[np.ndarray] = [
        reduce(np.add, layer_updates) / num_examples_total
        for layer_updates in zip(*weighted_weights, strict=True)
    ]
    return weights_prime


def rel_error(got: Any, want: np.ndarray) -> float:
    """max |got - want| / max |want| (0 when both are zero)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    diff = float(np.max(np.abs(g - w))) if w.size else 0.0
    return diff / scale if scale else diff
