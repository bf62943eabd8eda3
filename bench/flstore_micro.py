"""bench-flstore's sections besides the query latency: the zero-copy handoff (:func:`handoff`),
the policies' hit rates on the paper-shaped traces (:func:`policies`) and the location table's
lookup overhead (:func:`overhead`). Run by :mod:`bench.flstore`."""

from __future__ import annotations

import logging
import secrets
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.flstore_plan import POLICIES
from bench.harness.flstore_stack import FLStoreStack
from bench.harness.flstore_trace import hit_table, paper_traces
from bench.harness.round_clients import resnet18_layout
from bench.harness.round_window import status_bytes
from bench.harness.synthetic import SMALL_CNN, write_history
from bench.runinfo import PINNED_THREADS
from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import update
from cache_engine.table import LocationTable, RedisLocationTable, redis_lookup
from core.services import MinioServer, RedisServer

log = logging.getLogger("bench.flstore")


def policies() -> list[dict[str, Any]]:
    traces = paper_traces()
    notes = {t.name: t.note for t in traces}
    return [{**r.as_dict(), "note": notes[r.trace]} for r in hit_table(POLICIES, traces, 64)]


def _p99(samples: list[float]) -> float:
    return float(np.percentile(np.array(samples), 99))


def overhead(work: Path, sizes: tuple[int, ...] = (1000, 100_000)) -> dict[str, Any]:

    out: dict[str, Any] = {}
    rs = RedisServer(data_dir=work / "redis-ovh").start()
    try:
        r = rs.client(decode_responses=True)
        for n in sizes:
            r.flushall()
            keys = [update("job", f"c{i % 250:03d}", i // 250 + 1) for i in range(n)]
            tracemalloc.start()
            t = LocationTable()
            for i, k in enumerate(keys):
                t.add(k, f"flstore-cache-{i % 4}")
                t.add(k, f"flstore-cache-{(i + 1) % 4}")
            mem = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            rng = np.random.default_rng(0)
            probe = [keys[i] for i in rng.integers(0, n, 20000)]
            lat = []
            for k in probe:
                t0 = time.perf_counter_ns()
                t.get(k)
                lat.append((time.perf_counter_ns() - t0) / 1000)
            # the same table in Redis (what the tracker and a restarted engine read)
            pipe = r.pipeline(transaction=False)
            for i, k in enumerate(keys):
                pipe.hset(
                    "flstore:loc:" + k.job,
                    k.field,
                    f"flstore-cache-{i % 4},flstore-cache-{(i + 1) % 4}",
                )
            pipe.execute()
            used = int(r.memory_usage("flstore:loc:job") or 0)
            rlat = []
            for k in probe[:5000]:
                t0 = time.perf_counter_ns()
                redis_lookup(r, [k])
                rlat.append((time.perf_counter_ns() - t0) / 1000)
            rt = RedisLocationTable(r)
            t0 = time.perf_counter()
            rt.load()
            load_s = time.perf_counter() - t0
            # tracker records: one hash per query
            before = int(r.info("memory")["used_memory"])
            pipe = r.pipeline(transaction=False)
            for i in range(n):
                pipe.hset(
                    f"flstore:query:{i:032x}",
                    mapping={
                        "status": "done",
                        "workload": "multi-krum",
                        "job": "job",
                        "tried": '[{"function": "flstore-cache-0", "outcome": "ok"}]',
                        "latency_s": "0.01",
                    },
                )
            pipe.execute()
            qmem = int(r.info("memory")["used_memory"]) - before
            qlat = []
            for i in rng.integers(0, n, 5000):
                t0 = time.perf_counter_ns()
                r.hgetall(f"flstore:query:{int(i):032x}")
                qlat.append((time.perf_counter_ns() - t0) / 1000)
            out[str(n)] = {
                "engine_table_lookup_p99_us": _p99(lat),
                "engine_table_lookup_p50_us": float(np.median(lat)),
                "engine_table_memory_mb": mem / 1e6,
                "redis_table_lookup_p99_us": _p99(rlat),
                "redis_table_lookup_p50_us": float(np.median(rlat)),
                "redis_table_memory_mb": used / 1e6,
                "engine_restart_load_s": load_s,
                "tracker_record_get_p99_us": _p99(qlat),
                "tracker_records_memory_mb": qmem / 1e6,
            }
        r.close()
    finally:
        rs.stop()
    return out


def handoff(work: Path, rounds: int = 3, clients: int = 10, small: bool = False) -> dict[str, Any]:
    """Round complete -> every update of the round resident in a cache function, through the
    zero-copy handoff from the node's store and through MinIO, on one stack, alternating.

    Two jobs hold the same-sized rounds in MinIO (written by :func:`write_history`); for the
    handoff job this process also plays the root gateway's store side with the gateway's own
    code (a :class:`~core.objstore.Namespace` and a
    :class:`~core.objstore.handoff.HandoffServer`: the round's updates sealed in the store
    and offered). The clock starts at the engine's round notice (``POST .../complete``, with
    the offer for the handoff job, as the gateway sends it) and stops when
    ``/v1/locations`` names a holder for every update (polled every 2 ms). One copy per object
    (no secondaries). The cache functions' private and shared memory come from
    ``/proc/<pid>/status`` after each mode's rounds.
    """
    from core import wire
    from core.objstore import Namespace
    from core.objstore.handoff import HandoffServer

    shapes = SMALL_CNN if small else {n: tuple(s) for n, s in resnet18_layout()}
    spec = wire.ModelSpec.build([(n, "F32", s) for n, s in shapes.items()])
    ms = MinioServer(data_dir=work / "minio-handoff").start()
    rs = RedisServer(data_dir=work / "redis-handoff").start()
    stack: FLStoreStack | None = None
    root = Path("/dev/shm") / f"fedfaas-bench-{secrets.token_hex(4)}"
    ns = Namespace(root, "node0", "handoff-shm", spec.object_nbytes, pool=clients)
    server = HandoffServer(root / "node0" / "handoff.sock")
    try:
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        h = write_history(cold, "handoff-shm", rounds, per_round=clients, shapes=shapes, seed=1)
        write_history(
            cold, "handoff-minio", rounds, per_round=clients, shapes=shapes, seed=2, keep=False
        )
        model_bytes = spec.numel * 4
        stack = FLStoreStack(
            work / "stack-handoff",
            rs,
            ms,
            engine_settings={
                "secondaries": 0,
                "max_functions": 2,
                "function_capacity_bytes": model_bytes * (2 * rounds * clients + 16),
                "capacity_objects": 4 * rounds * (clients + 2) + 16,
                "function_env": PINNED_THREADS,
            },
        ).start()
        client = httpx.Client(timeout=600)
        stack.ingest("handoff-shm", [0])
        stack.ingest("handoff-minio", [0])
        stack.wait_idle(600)
        rows: list[dict[str, Any]] = []
        for r in range(1, rounds + 1):
            lent: dict[str, bytes] = {}
            for c, x in h.updates[r].items():
                obj = ns.allocate()
                wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=1, count=1, round=r)
                wire.flat_view(obj.buf, spec)[: spec.numel] = x
                lent[c] = obj.key_bytes
                obj.close()
                ns.seal(lent[c])
                ns.retain(lent[c])  # the offer's lease (the store keeps its own)
            ticket = server.offer(ns, "handoff-shm", r, spec.numel, spec.hash.hex(), lent, 300)
            offer = {"socket": str(server.path), "ticket": ticket, "node": "node0"}
            for job, body in (("handoff-shm", {"handoff": offer}), ("handoff-minio", None)):
                t0 = time.perf_counter()
                resp = client.post(
                    f"{stack.engine_url}/v1/jobs/{job}/rounds/{r}/complete",
                    json=body,
                    headers=stack.auth,
                )
                resp.raise_for_status()
                ids = [update(job, c, r).id for c in resp.json()["clients"]]
                while True:
                    loc = client.get(
                        f"{stack.engine_url}/v1/locations", params={"ids": ids}, headers=stack.auth
                    ).json()
                    if all(loc.get(i) for i in ids):
                        break
                    time.sleep(0.002)
                dt = time.perf_counter() - t0
                stack.wait_idle(600)
                rows.append({"round": r, "path": "shm" if body else "minio", "seconds": dt})
                log.info("handoff round %d via %s: %.3f s", r, rows[-1]["path"], dt)
        state = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        memory = {}
        for fn in state["functions"]:
            ping = client.get(
                f"{stack.runtime_url}/function/{fn}/ping", headers=stack.function_auth
            ).json()
            pid = int(ping["pid"])
            memory[fn] = {
                "objects": ping["count"],
                "mapped_in_place": ping["objects_mapped"],
                "private_mb": (status_bytes(pid, "RssAnon")) / 1e6,
                "shared_mb": status_bytes(pid, "RssShmem") / 1e6,
            }
        return {
            "model": "small CNN"
            if small
            else f"ResNet-18, 10 classes: its {len(shapes)} floating-point tensors",
            "model_mb": round(model_bytes / 1e6, 1),
            "clients": clients,
            "rounds": rounds,
            "rows": rows,
            "handed_off": state["stats"]["objects_handed_off"],
            "functions": memory,
        }
    finally:
        if stack is not None:
            stack.stop()
        server.close()
        ns.close()
        rs.stop()
        ms.stop()
