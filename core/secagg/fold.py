"""The eager fold of masked vectors, with the interface of :class:`core.fedavg.Accumulator`.

An aggregator endpoint folds a secure-aggregation job's objects with this instead of FedAvg's
axpy: ``acc += update`` in Z_2^32 (numpy's wrapping uint32 addition), with no weights in the
arithmetic (a client's weight is inside its masked vector, :mod:`core.secagg.quantize`) and
no division at the top: the top's result is the masked sum, which the holder of the round's
:class:`~core.secagg.coordinator.Coordinator` unmasks. ``weight`` and ``count`` are carried
as FedAvg's are (the frames and object headers keep them), so the hierarchy's bookkeeping is
the same. One core folds about as fast as memory reads (no multiply), so there is no
``threads`` split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .quantize import UINT


def _uint32(v: np.ndarray, what: str) -> np.ndarray:
    if v.dtype != UINT:
        raise TypeError(f"{what} must be uint32 (a masked vector), not {v.dtype}")
    return v


@dataclass
class MaskedAccumulator:
    """``(S, W, n)`` over a caller-owned uint32 vector ``acc``: ``S`` the Z_2^32 sum of the
    masked vectors folded, ``W`` the sum of the weights the frames carry, ``n`` the count.

    ``add`` folds a client's masked vector, ``merge`` a child's partial sum, ``merge_into``
    writes this one plus a partial into another vector (this one may be sealed), ``finalize``
    marks the sum final and returns it: no division.
    """

    acc: np.ndarray
    weight: float = 0.0
    count: int = 0
    _empty: bool = field(default=True, repr=False)
    final: bool = False

    def __post_init__(self) -> None:
        _uint32(self.acc, "the accumulator")

    def _check_open(self) -> None:
        if self.final:
            raise ValueError("this accumulator holds a final sum; nothing more folds in")

    def _fold(self, vec: np.ndarray) -> None:
        _uint32(vec, "a masked input")
        if self._empty:  # the first fold writes, so the accumulator needs no zeroing pass
            np.copyto(self.acc, vec)
        else:
            np.add(self.acc, vec, out=self.acc)
        self._empty = False

    def add(self, update: np.ndarray, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight}")
        self._check_open()
        self._fold(update)
        self.weight += float(weight)
        self.count += 1

    def merge(
        self, partial_sum: np.ndarray, weight: float, count: int, *, final: bool = False
    ) -> None:
        self._check_open()
        self._fold(partial_sum)
        self.weight += float(weight)
        self.count += int(count)
        self.final = final

    def merge_into(
        self,
        out: np.ndarray,
        partial_sum: np.ndarray,
        weight: float,
        count: int,
        *,
        final: bool = False,
    ) -> MaskedAccumulator:
        """A new accumulator over ``out`` holding this one plus a partial, in one pass; this
        one's vector is only read."""
        self._check_open()
        _uint32(out, "the output")
        _uint32(partial_sum, "a masked input")
        if self._empty:
            np.copyto(out, partial_sum)
        else:
            np.add(self.acc, partial_sum, out=out)
        return MaskedAccumulator(
            out,
            self.weight + float(weight),
            self.count + int(count),
            _empty=False,
            final=final,
        )

    def finalize(self, out: np.ndarray | None = None) -> np.ndarray:
        """The final masked sum (into ``out`` if given): nothing is divided."""
        if self._empty:
            raise ValueError("nothing was folded")
        self.final = True
        if out is None:
            return self.acc
        np.copyto(_uint32(out, "the output"), self.acc)
        return out
