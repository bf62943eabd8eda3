"""An always-on aggregator server answering FLStore queries from a remote store on every query.

- **ObjStore-Agg** (``--backend minio``): reads every object the query needs from MinIO.
- **Cache-Agg** (``--backend redis``): reads them from Redis (objects mirrored there once with
  ``POST /admin/mirror/{job}``, not timed), like a server in front of ElastiCache.

Both use the same query planning and the same workload code as the FLStore cache functions
(:mod:`cache_engine.queries`); only where the bytes come from differs. Reads go through a pool of
4 threads (a fair, not a naive, baseline).

Inner-product memo (``--no-gram-memo`` turns it off): a cache function keeps the inner products
between the vectors it holds across queries (``flstore_workloads.GramCache``). A baseline decodes
a fresh copy of every object on every query, so it gets the same memo keyed by the objects' ids
(their contents never change once written) instead of the vectors' identities
(:class:`ObjectGramMemo`): it still reads and decodes every object per query, but does not
recompute an inner product it computed before, as the cache function does not.

Cache-Agg reads 44.7 MB values through redis-py, whose reply parser is ``hiredis`` when that
package is installed (the ``bench`` extra) and pure Python otherwise; ``GET /healthz`` and every
answer say which one the server uses (``redis_parser``).

Usage: ``python -m bench.baselines --backend minio|redis --port P --minio H:P --redis URL``
(flags and defaults: :class:`~bench.baselines.settings.BaselineSettings`; the MinIO and Redis
users come from credentials files, ``--minio-credentials-file`` / ``--redis-credentials-file``).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from bench.baselines.settings import BaselineSettings
from bench.runinfo import max_pool_threads
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import MinioColdStore, decode_object
from cache_engine.evaluators import build_evaluator
from cache_engine.keys import ObjectKey
from cache_engine.queries import QueryError, parse_query, plan, run_workload
from flstore_workloads import GramCache
from flstore_workloads._linalg import merge

log = logging.getLogger(__name__)
REDIS_PREFIX = "baseline:obj:"


class ObjectGramMemo(GramCache):
    """:class:`~flstore_workloads.GramCache` keyed by object ids instead of vector identities.

    Inside :meth:`naming` (one query's decoded objects) a row over those objects' vectors is keyed
    by ``(coefficient, object id)`` terms, so the products computed on one query's copies answer
    for the next query's fresh copies of the same objects. A row over anything else (a vector no
    object of the query names) is not memoised.
    """

    def __init__(self, max_pairs: int = 1 << 18) -> None:
        super().__init__(max_pairs)
        self._local = threading.local()

    @contextmanager
    def naming(self, objects: Mapping[ObjectKey, Any]) -> Iterator[ObjectGramMemo]:
        """Key the rows of this thread's query by the ids of ``objects`` (vectors only)."""
        self._local.names = {id(v): k.id for k, v in objects.items() if isinstance(v, np.ndarray)}
        try:
            yield self
        finally:
            self._local.names = {}

    def key(self, row: Sequence[tuple[float, Any]]) -> Any:
        names: dict[int, str] = getattr(self._local, "names", {})
        merged = merge(row)
        if not merged or any(id(x) not in names for _, x in merged):
            return None
        return tuple(sorted((float(c), names[id(x)]) for c, x in merged))


class ObjectSource(ABC):
    """Where the baseline reads objects from."""

    name = "source"

    def parser(self) -> str | None:
        """The Redis reply parser this source reads with (``None``: it reads no Redis)."""
        return None

    @abstractmethod
    def get_bytes(self, key: ObjectKey) -> bytes: ...

    @abstractmethod
    def rounds(self, job: str) -> dict[int, list[str]]:
        """Written rounds of ``job`` with their clients."""


class MinioSource(ObjectSource):
    name = "objstore-agg"

    def __init__(self, cold: MinioColdStore) -> None:
        self.cold = cold

    def get_bytes(self, key: ObjectKey) -> bytes:
        return self.cold.get_bytes(key)

    def rounds(self, job: str) -> dict[int, list[str]]:
        return {r: list(self.cold.round_meta(job, r)["clients"]) for r in self.cold.rounds(job)}


class RedisSource(ObjectSource):
    name = "cache-agg"

    def __init__(self, redis: Any, cold: MinioColdStore) -> None:
        self.redis, self.cold = redis, cold

    def parser(self) -> str:
        """``hiredis`` or ``python``: the reply parser of a connection of the client's pool."""
        conn = self.redis.connection_pool.get_connection()
        try:
            name = type(conn._parser).__name__
        finally:
            self.redis.connection_pool.release(conn)
        return "hiredis" if "hiredis" in name.lower() else "python"

    def get_bytes(self, key: ObjectKey) -> bytes:
        data = self.redis.get(REDIS_PREFIX + key.id)
        if data is None:
            from cache_engine.cold_store import ObjectMissing

            raise ObjectMissing(key.id)
        return bytes(data)

    def rounds(self, job: str) -> dict[int, list[str]]:
        import json

        raw = self.redis.hgetall(f"baseline:rounds:{job}")
        return {int(r): json.loads(c) for r, c in raw.items()}

    def mirror(self, job: str) -> int:
        """Copy every object of ``job`` from MinIO into Redis (setup, not timed)."""
        import json

        n = 0
        for r in self.cold.rounds(job):
            m = self.cold.round_meta(job, r)
            keys = [ObjectKey(job, r, "meta"), ObjectKey(job, r, "global")]
            keys += [ObjectKey(job, r, "update", c) for c in m["clients"]]
            for k in keys:
                try:
                    self.redis.set(REDIS_PREFIX + k.id, self.cold.get_bytes(k))
                    n += 1
                except Exception:  # round 0 may lack updates; a job may lack a global
                    continue
            self.redis.hset(f"baseline:rounds:{job}", str(r), json.dumps(m["clients"]))
        return n


def create_app(source: ObjectSource, gram_memo: bool = True) -> FastAPI:
    """The baseline's HTTP app over ``source``; ``gram_memo``: keep an :class:`ObjectGramMemo`."""
    pool = ThreadPoolExecutor(max_workers=4)
    memo = ObjectGramMemo() if gram_memo else None
    parser = source.parser()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown(wait=False)

    app = FastAPI(title=f"baseline {source.name}", lifespan=lifespan)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {
            "ok": True,
            "backend": source.name,
            "gram_memo": memo is not None,
            "gram_pairs": len(memo) if memo is not None else 0,
            "redis_parser": parser,
        }

    @app.post("/admin/mirror/{job}")
    def mirror(job: str) -> dict[str, Any]:
        if not isinstance(source, RedisSource):
            return {"mirrored": 0}
        return {"mirrored": source.mirror(job)}

    @app.post("/v1/queries")
    def query(body: dict[str, Any]) -> Any:
        """Answer a query: read its objects from the store, then run the workload."""
        from flstore_workloads import WorkloadError

        t0 = time.perf_counter()
        try:
            q = parse_query(body)
            cat = MemoryCatalog()
            for r, clients in source.rounds(q.job).items():
                cat.add_round(q.job, r, clients)
            p = plan(q, cat)
            spent = {"fetch": 0.0, "decode": 0.0}
            lock = threading.Lock()

            def load(k: ObjectKey) -> Any:
                """Read then decode one object (its bytes dropped at once: a round of 200
                ResNet-18 updates is 9 GB, not 18)."""
                a = time.perf_counter()
                blob = source.get_bytes(k)
                b = time.perf_counter()
                v = decode_object(k, blob)
                with lock:
                    spent["fetch"] += b - a
                    spent["decode"] += time.perf_counter() - b
                if isinstance(v, np.ndarray):
                    v.flags.writeable = False  # sealed, as a cache function seals what it loads
                return v

            objs = dict(zip(p.keys, pool.map(load, p.keys), strict=True))
            wall = time.perf_counter() - t0
            # the threads fetch and decode at once: the wall time split as their time was
            share = spent["fetch"] / max(1e-12, spent["fetch"] + spent["decode"])
            t1 = t0 + wall * share
            evaluator = None
            if p.evaluator:  # the job's evaluator spec sits in round 0's metadata
                m0 = decode_object(
                    ObjectKey(q.job, 0, "meta"), source.get_bytes(ObjectKey(q.job, 0, "meta"))
                )
                evaluator = build_evaluator(m0.get("round_meta", {}).get("evaluator"))
            t2 = time.perf_counter()
            t1 = min(t1, t2)
            if memo is None:
                result = run_workload(q.workload, p.params, objs, evaluator)
            else:
                with memo.naming(objs):
                    result = run_workload(q.workload, p.params, objs, evaluator, memo)
        except (QueryError, WorkloadError) as exc:
            return JSONResponse(exc.to_dict(), status_code=int(getattr(exc, "status", 400)))
        t3 = time.perf_counter()
        return {
            "status": "done",
            "result": result,
            "fetch_s": t1 - t0,
            "decode_s": t2 - t1,
            "compute_s": t3 - t2,
            "latency_s": t3 - t0,
            "backend": source.name,
            "gram_memo": memo is not None,
            "redis_parser": parser,
            "threads": max_pool_threads(),
        }

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from core.secretfiles import read_credentials, redis_client

    s, log_level = BaselineSettings.from_argv(argv)
    logging.basicConfig(level=log_level)
    minio = read_credentials(s.minio_credentials_file, "MinIO")
    cold = MinioColdStore(s.minio_endpoint, minio.username, minio.password, create=False)
    source: ObjectSource = (
        MinioSource(cold)
        if s.backend == "minio"
        else RedisSource(redis_client(s.redis_url, s.redis_credentials_file), cold)
    )
    log.info("%s: gram memo %s, redis parser %s", source.name, s.gram_memo, source.parser())
    uvicorn.run(create_app(source, s.gram_memo), host=s.host, port=s.port, log_level="warning")
