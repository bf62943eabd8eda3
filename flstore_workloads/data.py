"""The data a workload runs on, as the cache function holds it in memory, and what it must load.

Conventions
-----------
- ``updates[r][client]`` is the flat float32 vector client ``client`` sent in round ``r``: its
  trained weights ``w_i`` (the default, what the gateway receives) or, with
  ``updates_are_deltas=True``, the update ``Delta_i = w_i - g_{r-1}`` itself.
- ``globals[v]`` is the global model after round ``v`` was aggregated; ``globals[0]`` is the
  initial model. Round ``r``'s clients trained from ``globals[r - 1]``, so
  ``Delta_i^r = updates[r][i] - globals[r - 1]``.
- ``client_meta[r][client]`` is a plain dict: ``n_samples`` (FedAvg weight), ``loss``,
  ``duration_s``, optional ``loss_sq_mean`` (mean of squared per-sample losses), ``lr``,
  ``batch_size``, ``epochs`` ...
- ``round_meta[r]`` is a plain dict for the round: ``lr``, ``batch_size``, ``epochs``,
  ``selected``, ``loss``, ``accuracy``, ``duration_s`` ...

Vectors may be read-only views of sealed shared-memory objects; nothing here writes to them.
A holder that keeps the same read-only vectors across queries (a cache function) plugs a
:class:`GramCache` as ``gram_cache`` so inner products already computed are not recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ._linalg import GramCache, Row, combine, gram, merge
from .errors import DataMismatch, MissingData


@runtime_checkable
class Evaluator(Protocol):
    """Utility of a flat parameter vector on a validation set (e.g. accuracy); higher is better."""

    def __call__(self, params: NDArray[np.float32]) -> float: ...


@runtime_checkable
class MetricsEvaluator(Evaluator, Protocol):
    """An evaluator that also reports named metrics (``accuracy``, ``loss``, ``n``)."""

    def metrics(self, params: NDArray[np.float32]) -> dict[str, float]: ...


@dataclass(frozen=True)
class Requirements:
    """What one query of a workload needs loaded, for the cache engine to map it to keys.

    Attributes
    ----------
    policy : str
        FLStore caching policy (P1-P4, paper Table 1) that fits the access pattern.
    update_rounds : tuple of int
        Rounds whose client updates are needed.
    clients : tuple of str or None
        Clients of those rounds whose updates are needed; ``None`` means all of the round's clients.
    global_versions : tuple of int
        Global models needed (``globals[v]``), including the base ``globals[r - 1]`` that turns
        weights into updates (not needed when the cache holds deltas).
    client_meta_rounds : tuple of int
        Rounds whose per-client metadata is needed.
    round_meta_rounds : tuple of int
        Rounds whose round-level metadata is needed.
    evaluator : bool
        Whether a validation-set evaluator is needed.
    """

    policy: str
    update_rounds: tuple[int, ...] = ()
    clients: tuple[str, ...] | None = None
    global_versions: tuple[int, ...] = ()
    client_meta_rounds: tuple[int, ...] = ()
    round_meta_rounds: tuple[int, ...] = ()
    evaluator: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable form."""
        return {
            "policy": self.policy,
            "update_rounds": list(self.update_rounds),
            "clients": None if self.clients is None else list(self.clients),
            "global_versions": list(self.global_versions),
            "client_meta_rounds": list(self.client_meta_rounds),
            "round_meta_rounds": list(self.round_meta_rounds),
            "evaluator": self.evaluator,
        }


@dataclass
class WorkloadData:
    """Container of in-memory FL data handed to :meth:`Workload.run` (see module docstring)."""

    updates: Mapping[int, Mapping[str, NDArray[np.floating]]] = field(default_factory=dict)
    globals: Mapping[int, NDArray[np.floating]] = field(default_factory=dict)
    client_meta: Mapping[int, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    round_meta: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    evaluator: Evaluator | None = None
    updates_are_deltas: bool = False
    gram_cache: GramCache | None = None
    #: utilities of sub-models already evaluated, kept across queries by a holder of the same
    #: sealed vectors (a cache function): see :class:`flstore_workloads.utility.UtilityCache`
    utility_cache: Any = None

    def gram(self, rows: Sequence[Row]) -> NDArray[np.float64]:
        """Gram matrix of ``rows`` (float64), through :attr:`gram_cache` when one is plugged."""
        return gram(rows, cache=self.gram_cache)

    def combine_many(self, rows: Sequence[Row]) -> list[NDArray[np.float32]]:
        """Each row (a linear combination of vectors) materialised as a float32 vector; a row
        that is one stored float32 vector is that vector itself (read-only: never write it)."""
        out = []
        for r in rows:
            terms = merge(r)
            one = len(terms) == 1 and terms[0][0] == 1.0 and terms[0][1].dtype == np.float32
            out.append(np.asarray(terms[0][1]) if one else combine(r))
        return out

    def combine(self, row: Row) -> NDArray[np.float32]:
        """One row materialised (:meth:`combine_many`)."""
        return self.combine_many([row])[0]

    def digest(self, x: NDArray[np.floating]) -> str:
        """A 128-bit BLAKE2b digest of a stored vector's float32 bytes (provenance)."""
        import hashlib

        buf = np.ascontiguousarray(x).view(np.uint8)
        return hashlib.blake2b(buf.data, digest_size=16).hexdigest()

    # -- lookups that raise MissingData with the facts ---------------------------------------
    def round_clients(self, r: int) -> list[str]:
        """Sorted client ids with an update in round ``r``."""
        if r not in self.updates or not self.updates[r]:
            raise MissingData("updates", round=r)
        return sorted(self.updates[r])

    def select(self, r: int, clients: Sequence[str] | None) -> list[str]:
        """``clients`` checked against round ``r`` (all of the round's clients when ``None``)."""
        present = self.round_clients(r)
        if clients is None:
            return present
        missing = [c for c in clients if c not in self.updates[r]]
        if missing:
            raise MissingData("update", round=r, clients=missing)
        return list(clients)

    def update(self, r: int, client: str) -> NDArray[np.floating]:
        """The raw vector client ``client`` sent in round ``r``."""
        try:
            return self.updates[r][client]
        except KeyError:
            raise MissingData("update", round=r, clients=[client]) from None

    def global_model(self, version: int) -> NDArray[np.floating]:
        """``globals[version]`` (the model after round ``version``)."""
        try:
            return self.globals[version]
        except KeyError:
            raise MissingData("global", round=version) from None

    def delta(self, r: int, client: str) -> Row:
        """``Delta = w - g_{r-1}`` of ``client`` in round ``r``, as linear terms."""
        u = self.update(r, client)
        if self.updates_are_deltas:
            return [(1.0, u)]
        return [(1.0, u), (-1.0, self.global_model(r - 1))]

    def weights(self, r: int, client: str) -> Row:
        """Model weights ``w`` of ``client`` in round ``r``, as linear terms."""
        u = self.update(r, client)
        if self.updates_are_deltas:
            return [(1.0, self.global_model(r - 1)), (1.0, u)]
        return [(1.0, u)]

    def base(self, r: int) -> NDArray[np.floating]:
        """The model round ``r`` started from, ``globals[r - 1]``."""
        return self.global_model(r - 1)

    def meta(self, r: int, client: str) -> Mapping[str, Any]:
        """Per-client metadata dict of round ``r``."""
        try:
            return self.client_meta[r][client]
        except KeyError:
            raise MissingData("client_meta", round=r, clients=[client]) from None

    def n_samples(self, r: int, client: str) -> float:
        """FedAvg weight ``n_i`` of ``client`` in round ``r`` (``client_meta[r][c]["n_samples"]``)."""
        m = self.meta(r, client)
        if "n_samples" not in m:
            raise MissingData("client_meta", round=r, clients=[client], key="n_samples")
        n = float(m["n_samples"])
        if not np.isfinite(n) or n <= 0:
            raise DataMismatch(f"n_samples of client {client!r} in round {r} must be > 0; got {n}")
        return n

    def weights_of(self, r: int, clients: Sequence[str], weighting: str) -> NDArray[np.float64]:
        """Normalised aggregation weights ``p_i`` (``"samples"``: n_i / sum n; ``"uniform"``)."""
        if weighting == "uniform":
            return np.full(len(clients), 1.0 / len(clients))
        n = np.array([self.n_samples(r, c) for c in clients], dtype=np.float64)
        return np.asarray(n / n.sum(), dtype=np.float64)

    def require_evaluator(self) -> Evaluator:
        """The evaluator, or :class:`MissingData` when none is plugged."""
        if self.evaluator is None:
            raise MissingData("evaluator")
        return self.evaluator
