"""What the parts of the cache engine share: its state, and the calls one part makes on another.

:class:`~cache_engine.engine.CacheEngine` is one object made of parts (:mod:`.placement`,
:mod:`.liveness`, :mod:`.background`), each a class over this state; the engine sets it up in
its constructor. The few calls across parts are declared here and defined by the part named;
the planner of queries over parts (:mod:`.parts`) is an object over this state that the
others reach through :class:`Parts`.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from cache_engine.budget import MemoryBudget
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import ColdStore
from cache_engine.functions import FunctionInfo
from cache_engine.keys import ObjectKey
from cache_engine.policies import Policy
from cache_engine.queries import Plan
from cache_engine.settings import EngineSettings
from cache_engine.table import RedisLocationTable
from core.openfaas import OpenFaaS


class Parts(Protocol):
    """What the engine and its parts ask of the planner of queries over coordinate parts
    (:class:`cache_engine.parts.PartPlanner`, which is made over this state)."""

    def close(self) -> None: ...
    def too_big(self, keys: Sequence[ObjectKey]) -> bool: ...
    def dim(self, job: str, model: ObjectKey) -> int: ...
    def covered(self, models: Sequence[ObjectKey]) -> int | None: ...
    def acquire(self, p: Plan) -> dict[str, Any]: ...
    def place(self, models: Sequence[ObjectKey], metas: Sequence[ObjectKey], n: int) -> str: ...
    def stream(
        self, p: Plan, models: Sequence[ObjectKey], metas: Sequence[ObjectKey], dim: int, why: str
    ) -> dict[str, Any]: ...


class EngineState:
    """The cache engine's state (set by its constructor) and its parts' shared calls."""

    s: EngineSettings
    redis: Any
    cold: ColdStore
    openfaas: OpenFaaS
    table: RedisLocationTable
    catalog: MemoryCatalog
    policy: Policy
    functions: dict[str, FunctionInfo]
    #: (job, "model" or a metadata object's id) -> bytes in a function
    sizes: dict[tuple[str, str], int]
    evaluators: dict[str, dict[str, Any]]
    #: the newest ingested rounds' metadata (normalized), by its key
    metas: OrderedDict[ObjectKey, dict[str, Any]]
    #: (job, round) -> where its root gateway lends its updates
    handoffs: OrderedDict[tuple[str, int], dict[str, Any]]
    stats: Counter[str]
    budget: MemoryBudget
    #: whole update -> the functions that map it (or parts of it) in place
    mapped: dict[ObjectKey, set[str]]
    parts: Parts
    _function_auth: dict[str, str]
    _lock: threading.RLock
    _inflight: dict[ObjectKey, threading.Event]
    _pending_evictions: int
    _bg: queue.Queue[tuple[str, Any]]
    _stop: threading.Event
    _pool: ThreadPoolExecutor

    def _kept(self, key: ObjectKey) -> bool:
        """Whether the policy keeps ``key`` (a part: the whole object it is part of)."""
        return key.whole in self.policy

    def _unmapped(self, fn: str, keys: Iterable[ObjectKey]) -> None:
        """``fn`` gave up ``keys``: an update it maps no part of any more is no longer kept in
        the store by it (under the lock)."""
        on_fn = {k.whole for k in self.table.keys_on(fn)}
        for whole in {k.whole for k in keys} - on_fn:
            fns = self.mapped.get(whole)
            if fns is not None:
                fns.discard(fn)
                if not fns:
                    del self.mapped[whole]
                    self.budget.unlease([f"mapped:{whole.id}"])

    # -- defined by the parts named -------------------------------------------------------
    def _invoke(
        self, fn: str, path: str, body: Any = None, timeout: float | None = None
    ) -> httpx.Response:
        """:mod:`.placement`"""
        raise NotImplementedError

    def _unplace(self, wholes: Any) -> dict[str, list[ObjectKey]]:
        """:mod:`.placement`"""
        raise NotImplementedError

    def place(self, keys: Any, *, restore: bool = False) -> None:
        """:mod:`.placement`"""
        raise NotImplementedError

    def make_budget_room(
        self, nbytes: int, keep: Sequence[ObjectKey], *, partial: bool = False
    ) -> None:
        """:mod:`.placement`"""
        raise NotImplementedError

    def ensure(self, keys: Sequence[ObjectKey], copies: int | None = None) -> list[str]:
        """:mod:`.placement`"""
        raise NotImplementedError

    def any_function(self) -> str:
        """:mod:`.placement`"""
        raise NotImplementedError

    def _size(self, key: ObjectKey) -> int:
        """:mod:`.placement`"""
        raise NotImplementedError

    def _live_holders(self, keys: Sequence[ObjectKey]) -> list[str]:
        """:mod:`.engine`"""
        raise NotImplementedError

    def _ping(self, name: str) -> dict[str, Any] | None:
        """:mod:`.liveness`"""
        raise NotImplementedError

    def report_failure(self, name: str) -> bool:
        """:mod:`.liveness`"""
        raise NotImplementedError

    def _evict(self, targets: dict[str, list[ObjectKey]]) -> None:
        """:mod:`.background`"""
        raise NotImplementedError

    def _evict_later(self, targets: dict[str, list[ObjectKey]]) -> None:
        """:mod:`.background`"""
        raise NotImplementedError
