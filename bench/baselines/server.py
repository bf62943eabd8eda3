"""An always-on aggregator server answering FLStore queries from a remote store on every query.

- **ObjStore-Agg** (``--backend minio``): reads every object the query needs from MinIO.
- **Cache-Agg** (``--backend redis``): reads them from Redis (objects mirrored there once with
  ``POST /admin/mirror/{job}``, not timed), like a server in front of ElastiCache.

Both use the same query planning and the same workload code as the FLStore cache functions
(:mod:`cache_engine.queries`); only where the bytes come from differs. Reads go through a pool of
4 threads (a fair, not a naive, baseline).

Usage: ``python -m bench.baselines --backend minio|redis --port P --minio H:P --redis URL``
(flags and defaults: :class:`~bench.baselines.settings.BaselineSettings`; the MinIO and Redis
users come from credentials files, ``--minio-credentials-file`` / ``--redis-credentials-file``).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from bench.baselines.settings import BaselineSettings
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import MinioColdStore, decode_object
from cache_engine.evaluators import build_evaluator
from cache_engine.keys import ObjectKey
from cache_engine.queries import QueryError, parse_query, plan, run_workload

log = logging.getLogger(__name__)
REDIS_PREFIX = "baseline:obj:"


class ObjectSource(ABC):
    """Where the baseline reads objects from."""

    name = "source"

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


def create_app(source: ObjectSource) -> FastAPI:
    pool = ThreadPoolExecutor(max_workers=4)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown(wait=False)

    app = FastAPI(title=f"baseline {source.name}", lifespan=lifespan)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "backend": source.name}

    @app.post("/admin/mirror/{job}")
    def mirror(job: str) -> dict[str, Any]:
        if not isinstance(source, RedisSource):
            return {"mirrored": 0}
        return {"mirrored": source.mirror(job)}

    @app.post("/v1/queries")
    def query(body: dict[str, Any]) -> Any:
        """Answer a query: read its objects from the store, then run the workload."""
        from fedfaas.workloads import WorkloadError

        t0 = time.perf_counter()
        try:
            q = parse_query(body)
            cat = MemoryCatalog()
            for r, clients in source.rounds(q.job).items():
                cat.add_round(q.job, r, clients)
            p = plan(q, cat)
            blobs = list(pool.map(source.get_bytes, p.keys))
            t1 = time.perf_counter()
            objs = {k: decode_object(k, b) for k, b in zip(p.keys, blobs, strict=True)}
            evaluator = None
            if p.evaluator:  # the job's evaluator spec sits in round 0's metadata
                m0 = decode_object(
                    ObjectKey(q.job, 0, "meta"), source.get_bytes(ObjectKey(q.job, 0, "meta"))
                )
                evaluator = build_evaluator(m0.get("round_meta", {}).get("evaluator"))
            t2 = time.perf_counter()
            result = run_workload(q.workload, p.params, objs, evaluator)
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
        }

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from fedfaas.secretfiles import read_credentials, redis_client

    s, log_level = BaselineSettings.from_argv(argv)
    logging.basicConfig(level=log_level)
    minio = read_credentials(s.minio_credentials_file, "MinIO")
    cold = MinioColdStore(s.minio_endpoint, minio.username, minio.password, create=False)
    source: ObjectSource = (
        MinioSource(cold)
        if s.backend == "minio"
        else RedisSource(redis_client(s.redis_url, s.redis_credentials_file), cold)
    )
    uvicorn.run(create_app(source), host=s.host, port=s.port, log_level="warning")
