"""The location table: which cache functions hold each object (primary first, then secondaries).

:class:`LocationTable` is the in-memory index (pure, used for lookups on the hot path);
:class:`RedisLocationTable` writes every change through to Redis, so the request tracker and a
restarted engine see the same table. Redis layout (one hash per job, one set per function)::

    flstore:loc:<job>   field "<round>/<client|global|meta>" -> "fn-a,fn-b"
    flstore:fn:<name>   members "<job>/<round>/<client|global|meta>"

Every change is also published on :data:`CHANGES`, which voids the plans the request tracker
keeps (the engine publishes its catalog's and its functions' changes there too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from cache_engine.keys import ObjectKey

LOC_PREFIX = "flstore:loc:"
FN_PREFIX = "flstore:fn:"
#: Redis channel: a message after every change a query's plan depends on (the location table,
#: the catalog of rounds, the jobs' evaluators, the functions' addresses). Its data is the job
#: changed, or "" for a change that may touch any job's plans (a function gone or moved).
CHANGES = "flstore:changes"


class LocationTable:
    """``ObjectKey -> [primary, secondaries...]`` with a reverse index per function."""

    def __init__(self) -> None:
        self._loc: dict[ObjectKey, list[str]] = {}
        self._by_fn: dict[str, set[ObjectKey]] = {}
        #: whole model -> the parts of it held somewhere (``ObjectKey.parts``)
        self._parts: dict[ObjectKey, set[ObjectKey]] = {}
        #: keys changed inside :meth:`batch`, written at its end
        self._pending: set[ObjectKey] | None = None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Write the changes made inside at its end, together (a round's parts are hundreds
        of entries: one round trip, not one each)."""
        if self._pending is not None:  # nested: the outer one writes
            yield
            return
        self._pending = set()
        try:
            yield
        finally:
            keys, self._pending = self._pending, None
            if keys:
                self._flush(sorted(keys))

    def parts_of(self, whole: ObjectKey) -> set[ObjectKey]:
        """The parts of ``whole`` held somewhere (any number of parts)."""
        return set(self._parts.get(whole, ()))

    def _index(self, key: ObjectKey) -> None:
        """Keep :meth:`parts_of` in step with ``key``'s entry."""
        if not key.parts:
            return
        if key in self._loc:
            self._parts.setdefault(key.whole, set()).add(key)
        else:
            held = self._parts.get(key.whole)
            if held is not None:
                held.discard(key)
                if not held:
                    del self._parts[key.whole]

    def __len__(self) -> int:
        return len(self._loc)

    def get(self, key: ObjectKey) -> list[str]:
        """Functions holding ``key``, primary first (empty when not cached)."""
        return list(self._loc.get(key, ()))

    def lookup(self, keys: Sequence[ObjectKey]) -> dict[ObjectKey, list[str]]:
        """:meth:`get` for many keys."""
        return {k: list(self._loc.get(k, ())) for k in keys}

    def objects(self) -> list[ObjectKey]:
        return list(self._loc)

    def keys_on(self, fn: str) -> set[ObjectKey]:
        """Objects that function ``fn`` holds."""
        return set(self._by_fn.get(fn, ()))

    def functions(self) -> list[str]:
        return sorted(f for f, ks in self._by_fn.items() if ks)

    def add(self, key: ObjectKey, fn: str) -> None:
        """Record that ``fn`` holds ``key`` (appended as a secondary if others hold it)."""
        fns = self._loc.setdefault(key, [])
        if fn not in fns:
            fns.append(fn)
            self._by_fn.setdefault(fn, set()).add(key)
            self._index(key)
            self._write(key)

    def discard(self, key: ObjectKey, fn: str) -> None:
        """Record that ``fn`` no longer holds ``key``."""
        fns = self._loc.get(key)
        if fns and fn in fns:
            fns.remove(fn)
            self._by_fn.get(fn, set()).discard(key)
            if not fns:
                del self._loc[key]
            self._index(key)
            self._write(key)

    def remove(self, key: ObjectKey) -> list[str]:
        """Forget ``key`` everywhere; return the functions that held it."""
        fns = self._loc.pop(key, [])
        for f in fns:
            self._by_fn.get(f, set()).discard(key)
        self._index(key)
        self._write(key)
        return fns

    def drop_function(self, fn: str) -> dict[ObjectKey, list[str]]:
        """Forget function ``fn`` (it died); return its objects with the holders that remain."""
        out: dict[ObjectKey, list[str]] = {}
        for key in list(self._by_fn.pop(fn, set())):
            fns = self._loc.get(key, [])
            if fn in fns:
                fns.remove(fn)
            if not fns:
                self._loc.pop(key, None)
            self._index(key)
            out[key] = list(fns)
            self._write(key)
        self._drop_fn(fn)
        return out

    def _write(self, key: ObjectKey) -> None:
        if self._pending is not None:
            self._pending.add(key)
        else:
            self._flush([key])

    # write-through hooks (no-ops in memory)
    def _flush(self, keys: Sequence[ObjectKey]) -> None:
        pass

    def _drop_fn(self, fn: str) -> None:
        pass


class RedisLocationTable(LocationTable):
    """A :class:`LocationTable` whose every change is written through to Redis.

    Parameters
    ----------
    redis
        A ``redis.Redis`` client (``decode_responses=True``).
    """

    def __init__(self, redis: Any) -> None:
        super().__init__()
        self.redis = redis

    def load(self) -> int:
        """Read the whole table from Redis (engine restart); return the number of objects."""
        self._loc.clear()
        self._by_fn.clear()
        self._parts.clear()
        for hkey in self.redis.scan_iter(match=LOC_PREFIX + "*", count=1000):
            job = hkey[len(LOC_PREFIX) :]
            for field, val in self.redis.hgetall(hkey).items():
                key = ObjectKey.parse(f"{job}/{field}")
                fns = [f for f in val.split(",") if f]
                if fns:
                    self._loc[key] = fns
                    self._index(key)
                    for f in fns:
                        self._by_fn.setdefault(f, set()).add(key)
        return len(self._loc)

    def _flush(self, keys: Sequence[ObjectKey]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            fns = self._loc.get(key)
            if fns:
                pipe.hset(LOC_PREFIX + key.job, key.field, ",".join(fns))
            else:
                pipe.hdel(LOC_PREFIX + key.job, key.field)
            for f, ks in self._by_fn.items():
                if key in ks:
                    pipe.sadd(FN_PREFIX + f, key.id)
                else:
                    pipe.srem(FN_PREFIX + f, key.id)
        for job in sorted({k.job for k in keys}):
            pipe.publish(CHANGES, job)
        pipe.execute()

    def _drop_fn(self, fn: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(FN_PREFIX + fn)
        pipe.publish(CHANGES, "")
        pipe.execute()


def redis_lookup(redis: Any, keys: Iterable[ObjectKey]) -> dict[ObjectKey, list[str]]:
    """Read the holders of ``keys`` straight from Redis (what the request tracker does)."""
    keys = list(keys)
    by_job: dict[str, list[ObjectKey]] = {}
    for k in keys:
        by_job.setdefault(k.job, []).append(k)
    out: dict[ObjectKey, list[str]] = {}
    if len(by_job) == 1:
        job, ks = next(iter(by_job.items()))
        vals = redis.hmget(LOC_PREFIX + job, [k.field for k in ks])
        return {k: [f for f in (v or "").split(",") if f] for k, v in zip(ks, vals, strict=True)}
    pipe = redis.pipeline(transaction=False)
    for job, ks in by_job.items():
        pipe.hmget(LOC_PREFIX + job, [k.field for k in ks])
    for (_, ks), vals in zip(by_job.items(), pipe.execute(), strict=True):
        for k, v in zip(ks, vals, strict=True):
            out[k] = [f for f in (v or "").split(",") if f]
    return out
