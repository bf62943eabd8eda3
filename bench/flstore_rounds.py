"""bench-flstore section: rounds of 120 and 200 ResNet-18-sized updates (issue 36).

Each size is a job of its own in MinIO: round 0 (the initial model) and round 1, whose
``n`` clients each sent 11,181,642 float32 (44.7 MB, ResNet-18 with 10 classes). Every model
leads with a real classifier, softmax regression on digits (tensors ``bias`` and ``weight``,
650 floats, trained by each client on its shard for one epoch), followed by synthetic
ResNet-18-sized tensors (honest clients step along a shared direction plus noise, as
:func:`bench.harness.synthetic.write_history` does). Client ``c001`` is malicious: it trains
on flipped labels and sends the opposite step. The job's evaluator is ``digits-softmax`` with
``"head": true`` (accuracy of the leading classifier), so leave-one-out and Shapley values mean
something at this size; cosine, Multi-Krum and FoolsGold see the whole vectors.

Each size runs on a fresh ``fedfaas up --with all`` (:class:`bench.flstore_platform.UpWithAll`)
whose node memory budget is ``budget`` bytes (``--budget-gb``: 4 GB in the stored results,
below both rounds: 5.4 GB at 120 updates, 9.0 GB at 200). The job is written to the platform's
MinIO, which the baselines read too; ``fedfaas down`` removes it before the next size (the two
sizes' 14.5 GB need not sit on this machine's disk at once). One system at a time (their
memory would not fit this machine together), each query asked ``repeats`` times in a row of
each system (the median and the spread of the askings in the table). A run may ask some of the
systems only (:data:`SYSTEMS`): :mod:`bench.flstore_merge` joins the systems of one size from
several runs, each naming its run. The memos
across queries are off on all three (the cache functions' inner-product and utility memos, the
baselines' inner-product memo), so that every asking does the whole work and the askings are
alike; within one query, GTG-Shapley still evaluates each sub-model once.

1. **ObjStore-Agg**: the queries, each reading the round from MinIO and computing in process
   on the whole vectors (the direct in-process computation FedFaaS's answers are compared
   with), while FLStore holds nothing of the job.
2. **Cache-Agg**: the same, from Redis (the round mirrored there first, not timed; no
   append-only file), where the machine's free memory holds the mirror and the server's copy
   (waiting up to :data:`CACHE_AGG_MEMORY_WAIT_S` for it, skipped otherwise, said so). With
   the FLStore side holding nothing yet, no more than these two copies are in memory at once
   (MinIO's are on disk).
3. **FedFaaS**: the round is ingested (the policy's prefetch places it in coordinate parts
   across cache functions as the budget allows), then the queries are asked through the
   platform's request tracker; a sampler reads the cache functions' private memory
   (``RssAnon``) all along, the engine's budget account, and the platform's cgroup where it
   runs in one (:mod:`bench.flstore_rounds_memory`); the engine's log is searched for
   tracebacks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from numpy.typing import NDArray

from bench.baselines.settings import BaselineSettings
from bench.flstore_platform import UpWithAll
from bench.flstore_rounds_memory import MemorySampler, platform_group
from bench.harness.cgroups import Cgroup
from bench.harness.flstore_stack import Child, FLStoreStack
from bench.runinfo import PINNED_THREADS
from cache_engine.cold_store import MinioColdStore, encode_model
from cache_engine.evaluators import digits_split
from cache_engine.keys import ObjectKey
from core.services import MinioServer, RedisServer, free_port

log = logging.getLogger("bench.flstore")
RESNET18 = 11_181_642
HEAD = 650
FILLER_PARTS = 4
#: GTG-Shapley at this size: one permutation costs up to n sub-models of 44.7 MB each
GTG_PERMUTATIONS = 5
#: the systems asked, as a run names them (``--big-systems``)
SYSTEMS = ("fedfaas", "objstore-agg", "cache-agg")
#: no memo across queries in the cache functions (see the module)
NO_MEMOS = {"FEDFAAS_FLSTORE_GRAM_MEMO": "0", "FEDFAAS_FLSTORE_UTILITY_MEMO": "0"}


@dataclass
class CacheRedis(RedisServer):
    """Cache-Agg's Redis: no append-only file (a cache, like ElastiCache; mirroring ResNet-sized
    rounds would otherwise write them all to disk again, and its rewrite forks the server)."""

    def command(self) -> list[str]:
        return [*super().command(), "--appendonly", "no"]  # the last value of a directive wins


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def same_answer(a: Any, b: Any, rtol: float = 1e-4) -> bool:
    """Two answers alike: the same keys, lists and strings, integers equal, and floats within
    ``rtol`` relative to their scale. The numbers of one list or of one dict's values are one
    vector whose scale is its largest magnitude on either side (a Shapley value of 1e-3 in a
    vector whose largest is 5e-3 must be within 5e-7; near-zero entries of a vector are not
    compared to themselves); a lone float is compared to its own magnitude."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        keys = sorted(a)
        if keys and all(_number(a[k]) and _number(b[k]) for k in keys):
            return _same_vector([a[k] for k in keys], [b[k] for k in keys], rtol)
        return all(same_answer(a[k], b[k], rtol) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        if a and all(_number(x) and _number(y) for x, y in zip(a, b, strict=True)):
            return _same_vector(a, b, rtol)
        return all(same_answer(x, y, rtol) for x, y in zip(a, b, strict=True))
    if _number(a) and _number(b):
        return _same_vector([a], [b], rtol)
    return bool(a == b)


def _same_vector(a: list[Any], b: list[Any], rtol: float) -> bool:
    """Integers equal; floats within ``rtol`` times the vector's largest magnitude."""
    if any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b, strict=True)):
        return False
    scale = max(max(abs(float(x)) for x in a), max(abs(float(y)) for y in b))
    return all(abs(float(x) - float(y)) <= rtol * scale for x, y in zip(a, b, strict=True))


def _filler_shapes() -> dict[str, tuple[int, ...]]:
    total = RESNET18 - HEAD
    each = total // FILLER_PARTS
    out: dict[str, tuple[int, ...]] = {f"z{i}.weight": (each,) for i in range(FILLER_PARTS - 1)}
    out[f"z{FILLER_PARTS - 1}.weight"] = (total - each * (FILLER_PARTS - 1),)
    return out


def _split(flat: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
    out = {"bias": flat[:10], "weight": flat[10:HEAD].reshape(10, 64)}
    off = HEAD
    for name, shape in sorted(_filler_shapes().items()):
        out[name] = flat[off : off + shape[0]]
        off += shape[0]
    return out


def write_job(cold: MinioColdStore, job: str, n: int, seed: int = 0) -> list[str]:
    """Rounds 0 and 1 of ``job`` with ``n`` clients (see the module); the clients."""
    xt, yt, _, _ = digits_split(seed)
    rng = np.random.default_rng(seed)
    d = RESNET18 - HEAD
    g = np.zeros(RESNET18, np.float32)
    g[HEAD:] = rng.normal(0, 0.1, d)
    direction = rng.normal(0, 1, d).astype(np.float32)
    direction /= np.linalg.norm(direction)
    evaluator = {"kind": "digits-softmax", "split_seed": seed, "head": True}
    cold.write_round(job, 0, {}, _split(g), {}, {"evaluator": evaluator, "note": "initial"})
    clients = [f"c{i:03d}" for i in range(n)]
    shards = np.array_split(rng.permutation(len(yt)), n)
    acc = np.zeros(RESNET18, np.float64)
    total = 0
    meta: dict[str, dict[str, Any]] = {}
    for c, idx in zip(clients, shards, strict=True):
        x, y = xt[idx], yt[idx]
        bad = c == "c001"
        if bad:
            y = 9 - y
        w, b = np.zeros((10, 64), np.float32), np.zeros(10, np.float32)
        for bi in np.array_split(rng.permutation(len(y)), max(1, len(y) // 4)):
            z = x[bi] @ w.T + b
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(bi)), y[bi]] -= 1
            w -= 0.5 * (p.T @ x[bi]) / len(bi)
            b -= 0.5 * p.mean(axis=0)
        step = 0.05 * direction + rng.normal(0, 0.03 / np.sqrt(d), d).astype(np.float32)
        flat = np.empty(RESNET18, np.float32)
        flat[:10], flat[10:HEAD] = b, w.ravel()
        flat[HEAD:] = g[HEAD:] + (-step if bad else step)
        cold.put_bytes(ObjectKey(job, 1, "update", c), encode_model(_split(flat)))
        acc += len(y) * flat
        total += len(y)
        meta[c] = {"n_samples": len(y), "loss": 1.0, "duration_s": 1.0}
    new_global = (acc / total).astype(np.float32)
    cold.put_bytes(ObjectKey(job, 1, "global"), encode_model(_split(new_global)))
    doc = {"round": 1, "clients": clients, "client_meta": meta, "round_meta": {"lr": 0.5}}
    cold.put_bytes(ObjectKey(job, 1, "meta"), json.dumps(doc).encode())
    return clients


def gtg_params(permutations: int = GTG_PERMUTATIONS) -> dict[str, Any]:
    """GTG-Shapley's parameters in this section."""
    return {"method": "gtg", "max_permutations": permutations}


#: the issue's queries, by workload
WORKLOADS = ("cosine-to-aggregate", "multi-krum", "foolsgold", "leave-one-out", "shapley")


def queries(
    job: str, gtg: dict[str, Any], only: Sequence[str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The issue's queries on round 1 of ``job`` (``only``: those workloads)."""
    every = [
        (w, {"workload": w, "job": job, **b})
        for w, b in (
            ("cosine-to-aggregate", {"rounds": [1], "params": {"bottom_k": 1}}),
            ("multi-krum", {"rounds": [1], "params": {"f": 2}}),
            ("foolsgold", {"params": {"first_round": 1, "last_round": 1}}),
            ("leave-one-out", {"rounds": [1]}),
            ("shapley", {"rounds": [1], "params": gtg}),
        )
    ]
    return [q for q in every if only is None or q[0] in only]


#: a cache function's profile fields (``functions.flstore.parts.PROFILE``, and its queries'
#: time as a reducer, ``run_s``), summed over the functions and divided by the askings
PROFILE_COLUMNS = (
    ("run_s", "queries' /run s"),
    ("reducer_parts_s", "reducer waiting for parts s"),
    ("part_held_s", "parts on held data s"),
    ("stream_wait_s", "streams waiting for the stream s"),
    ("stream_index_s", "tensor indexes s"),
    ("stream_read_s", "MinIO ranged reads s"),
    ("stream_compute_s", "products on streamed chunks s"),
    ("streamed_bytes", "GB streamed"),
    ("streamed_requests", "ranged reads"),
)


def _profiles(stack: FLStoreStack) -> dict[str, dict[str, float]]:
    """Each cache function's profile counters (its ``/ping``; see :data:`PROFILE_COLUMNS`)."""
    st = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth, timeout=30).json()
    out = {}
    for name in st["functions"]:
        r = httpx.get(
            f"{stack.runtime_url}/function/{name}/ping", headers=stack.function_auth, timeout=30
        )
        if r.status_code == 200:
            body = r.json()
            out[name] = {k: float(body.get(k) or 0) for k, _ in PROFILE_COLUMNS}
    return out


def _profile_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """What each function spent between two :func:`_profiles` (functions that did nothing
    left out)."""
    out = {}
    for name, now in after.items():
        was = before.get(name, {})
        spent = {k: v - was.get(k, 0.0) for k, v in now.items()}
        if any(spent.values()):
            out[name] = spent
    return out


def _ask(
    client: httpx.Client, url: str, body: dict[str, Any], repeats: int, **kw: Any
) -> dict[str, Any]:
    """``body`` asked ``repeats`` times: each asking's latency, their median, the first
    answer and whether every asking answered it; the first error stops the askings."""
    lat: list[float] = []
    first: Any = None
    alike = True
    for i in range(repeats):
        t0 = time.perf_counter()
        r = client.post(url, json=body, **kw)
        lat.append(time.perf_counter() - t0)
        if r.status_code != 200:
            return {
                "latency_s": float(np.median(lat)),
                "latencies_s": lat,
                "error": f"HTTP {r.status_code} {r.text[:300]}",
            }
        res = r.json()["result"]
        if i == 0:
            first = res
        else:
            alike = alike and same_answer(res, first)
    return {
        "latency_s": float(np.median(lat)),
        "latencies_s": lat,
        "result": first,
        "same_each_asking": alike,
    }


def _engine_settings(budget: int) -> dict[str, Any]:
    """The cache engine's settings in this section (the platform's defaults otherwise)."""
    return {
        "node_memory_bytes": budget,
        "max_functions": 16,
        "function_env": {**PINNED_THREADS, **NO_MEMOS},
        "call_timeout": 600,
    }


def _fedfaas(
    stack: FLStoreStack,
    job: str,
    repeats: int,
    gtg: dict[str, Any],
    only: Sequence[str] | None = None,
    group: Cgroup | None = None,
    trace: Path | None = None,
) -> dict[str, Any]:
    """The round ingested (the policy's prefetch places it as the budget allows), then the
    queries asked through the tracker of ``stack`` (started), its functions' memory sampled
    (and the platform's ``group``'s, where it runs in one; each sample in ``trace``)."""
    sampler = MemorySampler(stack, group, trace)
    try:
        client = httpx.Client(timeout=3600)
        t0 = time.perf_counter()
        sampler.query = "ingest and prefetch"
        stack.ingest(job, [0, 1])
        stack.wait_idle(3600)
        ingest_s = time.perf_counter() - t0
        rows = {}
        for wl, body in queries(job, gtg, only):
            sampler.query = wl
            before = _profiles(stack)
            counted = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
            rows[wl] = _ask(
                client,
                f"{stack.tracker_url}/v1/queries?wait=true",
                body,
                repeats,
                headers=stack.auth,
            )
            rows[wl]["profile"] = _profile_delta(before, _profiles(stack))
            now = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
            rows[wl]["engine_stats"] = {  # what the engine did meanwhile (loads, evictions)
                k: v - counted["stats"].get(k, 0)
                for k, v in now["stats"].items()
                if v != counted["stats"].get(k, 0)
            }
            log.info("big %s fedfaas %s: %.1f s", job, wl, rows[wl]["latency_s"])
        state = client.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        return {
            "ingest_and_prefetch_s": ingest_s,
            "queries": rows,
            "memory": sampler.stop(),
            "budget": state["memory_budget"],
            "stats": {
                k: state["stats"][k]
                for k in (
                    "queries_in_parts",
                    "queries_partly_streamed",
                    "queries_streamed",
                    "loads_failed",
                    "over_budget",
                )
            },
            "functions": len(state["functions"]),
        }
    finally:
        sampler.stop()


def _baseline(
    work: Path,
    name: str,
    ms: MinioServer,
    rs: RedisServer | None,
    job: str,
    repeats: int,
    gtg: dict[str, Any],
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    s = BaselineSettings(
        backend="minio" if rs is None else "redis",
        port=free_port(),
        minio_endpoint=ms.endpoint,
        minio_credentials_file=ms.credentials_file("cache-engine"),
        redis_url=rs.url if rs is not None else "redis://127.0.0.1:1/0",
        redis_credentials_file=rs.credentials_file("baseline") if rs is not None else None,
        gram_memo=False,
    )
    child = Child(name, s.to_argv(log_level="warning"), work / "logs" / f"{name}-{job}.log", s.port)
    child.env = dict(PINNED_THREADS)
    try:
        child.start()  # within the try: a SIGTERM while it starts still stops it
        client = httpx.Client(timeout=3600)
        url = f"http://{s.host}:{s.port}"
        mirror_s = None
        if rs is not None:
            t0 = time.perf_counter()
            client.post(f"{url}/admin/mirror/{job}").raise_for_status()
            mirror_s = time.perf_counter() - t0
        rows = {}
        for wl, body in queries(job, gtg, only):
            rows[wl] = _ask(client, f"{url}/v1/queries", body, repeats)
            log.info("big %s %s %s: %.1f s", job, name, wl, rows[wl]["latency_s"])
        return {"queries": rows, "mirror_s": mirror_s}
    finally:
        child.stop()


#: how long Cache-Agg waits for the memory its two copies need (others share the machine)
CACHE_AGG_MEMORY_WAIT_S = 180.0


def _wait_available(need: int, timeout: float) -> bool:
    """Whether ``need`` bytes are free (``MemAvailable``), waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while _available() <= need:
        if time.monotonic() > deadline:
            return False
        time.sleep(5)
    return True


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def big_rounds(
    work: Path,
    sizes: list[int],
    budget: int,
    repeats: int = 3,
    gtg_permutations: int = GTG_PERMUTATIONS,
    only: Sequence[str] | None = None,
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, Any]:
    """Every size of ``sizes`` (see the module) on a fresh ``fedfaas up --with all`` each, each
    query asked ``repeats`` times of each system of ``systems`` (of :data:`SYSTEMS`); FedFaaS's
    answers compared with ObjStore-Agg's where both are asked (``only``: those of
    :data:`WORKLOADS`)."""
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        raise ValueError(f"systems must be some of {SYSTEMS}, not {list(systems)}")
    out: dict[str, Any] = {
        "budget_bytes": budget,
        "gtg_params": gtg_params(gtg_permutations),
        "repeats": repeats,
        "gtg_repeats": repeats,
        "memos": "off",
        "platform": "fedfaas up --with all",
        "sizes": {},
    }
    for n in sizes:
        out["sizes"][str(n)] = _one_size(work, n, budget, repeats, out["gtg_params"], only, systems)
    return out


def _one_size(
    work: Path,
    n: int,
    budget: int,
    repeats: int,
    gtg: dict[str, Any],
    only: Sequence[str] | None = None,
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, Any]:
    job = f"big{n}"
    obj: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None
    fed: dict[str, Any] | None = None
    need = None
    with contextlib.ExitStack() as stack:
        group = stack.enter_context(platform_group(f"fedfaas-flstore-{n}-{os.getpid()}"))
        up = UpWithAll(work / f"up-{n}", _engine_settings(budget), {"query_timeout": 600})
        with group.spawning() if group is not None else contextlib.nullcontext():
            up.start()  # every process of the platform born in the group
        stack.callback(up.stop)  # before the group is removed
        ms = up.minio
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        t0 = time.perf_counter()
        write_job(cold, job, n)
        log.info("wrote %s: %d updates in %.0f s", job, n, time.perf_counter() - t0)
        round_bytes = (n + 1) * RESNET18 * 4
        # the baselines first, while FLStore holds nothing of the job
        if "objstore-agg" in systems:
            obj = _baseline(work, "objstore-agg", ms, None, job, repeats, gtg, only)
        if "cache-agg" in systems:
            need = 2 * round_bytes + (1 << 30)  # Redis's copy, the server's, some room
            if _wait_available(need, CACHE_AGG_MEMORY_WAIT_S):
                crs = CacheRedis(data_dir=work / f"big-cache-redis-{n}").start()
                try:
                    cache = _baseline(work, "cache-agg", ms, crs, job, repeats, gtg, only)
                    need = None
                finally:
                    crs.stop()
                    shutil.rmtree(crs.data_dir, ignore_errors=True)  # its append-only file
            else:
                log.warning(
                    "Cache-Agg not run at %d updates: %d bytes free, %d needed",
                    n,
                    _available(),
                    need,
                )
        if "fedfaas" in systems:
            trace = work / f"memory-trace-{n}.jsonl"  # every sample, beside the platform's logs
            fed = _fedfaas(up, job, repeats, gtg, only, group, trace)
            fed["engine_log_tracebacks"] = up.engine_log().count("Traceback")
        from bench.flstore_rounds_reference import against_reference

        t0 = time.perf_counter()
        reference = against_reference(
            cold,
            queries(job, gtg, only),
            {"fedfaas": fed, "objstore-agg": obj, "cache-agg": cache},
        )
        log.info("reference answers at %d updates in %.0f s", n, time.perf_counter() - t0)
    same, same_cache = (
        _same_answers(fed, obj, job, gtg, only),
        _same_answers(fed, cache, job, gtg, only),
    )
    for row in (fed, obj, cache):  # the JSON keeps figures, not 200-client answers
        for q in (row or {}).get("queries", {}).values():
            q.pop("result", None)
    return {
        "updates": n,
        "round_bytes": round_bytes,
        "systems": list(systems),
        "fedfaas": fed,
        "objstore-agg": obj,
        "cache-agg": cache,
        "cache_agg_skipped_need_bytes": need,
        "cache_agg_not_asked": "cache-agg" not in systems,
        "same_answer": same,
        "same_answer_cache_agg": same_cache,
        "reference": reference,
    }


def _same_answers(
    fed: dict[str, Any] | None,
    other: dict[str, Any] | None,
    job: str,
    gtg: dict[str, Any],
    only: Sequence[str] | None,
) -> dict[str, bool] | None:
    """Per workload, whether FedFaaS's answer equals ``other``'s (None where one was not run)."""
    if fed is None or other is None:
        return None
    return {
        wl: "result" in fed["queries"][wl]
        and "result" in other["queries"][wl]
        and same_answer(fed["queries"][wl]["result"], other["queries"][wl]["result"])
        for wl, _ in queries(job, gtg, only)
    }
