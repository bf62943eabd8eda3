"""FLStore cache function (``flstore-cache-N``): holds FL objects in memory and runs workloads.

One function per cache shard, created and removed by the cache engine through the provider API.
Objects are client updates and global models (flat float32 numpy vectors, tensors in sorted-name
order) and round metadata (dicts), loaded from the cold store (MinIO) when the engine says so.

Routes (python3-http contract; JSON in and out; bad input gets a 4xx ``{"error", "detail"}``):

- ``GET /ping``: liveness and memory use (``private_bytes`` and ``resting_bytes``, the part
  of it that is not a request's working memory: :mod:`.memory`), and ``runs_in_flight``: the
  ``/run`` calls inside this function right now.
- ``GET /objects``: holdings with sizes.
- ``POST /load`` ``{"objects": ["<job>/<round>/<client|global|meta>", ...], "credentials":
  {"<job>": {"access_key", "secret_key", "session_token", "expires"}}, "handoff"?: [{"socket",
  "ticket", "node"}]}``: load from MinIO. The function has no MinIO user of its own: the cache
  engine sends, with each load, temporary credentials that read only the objects of each job
  named (see :meth:`cache_engine.cold_store.MinioColdStore.job_credentials`). Updates of a
  round a ``handoff`` names are first claimed from that gateway's store
  (:mod:`core.objstore.handoff`): mapped read-only in place, no copy, each kept alive by a
  lease until evicted here; a gateway this function cannot reach (another node) or an offer
  gone leaves them to MinIO. The answer's ``mapped`` lists the objects mapped in place. Should
  the gateway go away, its objects are dropped at once (a later query gets 409 ``not_held``
  and the engine loads them again).
- ``POST /evict`` ``{"objects": [...]}``: drop objects and give their memory back to the OS
  (:func:`core.memory.release_free_memory`), so memory follows the bytes held; an object
  mapped from a gateway's store gives its lease back.
- ``POST /run`` ``{"workload", "params", "objects": [...], "evaluator"?, "slices"?,
  "layout"?}``: run a workload on held objects (``evaluator``: the job's validation-set spec,
  see cache_engine.evaluators; a ``function`` evaluator gets the models as safetensors of the
  job's tensors, whose names and shapes this function keeps from the newest model of the job it
  loaded, or the plan's ``layout``). With ``slices`` (a round too large for one function: the
  engine's plan, :mod:`cache_engine.parts`) this function is the query's reducer: it holds the
  query's metadata, and the models are held in coordinate parts by the functions the slices
  name, each asked for its part (``POST /part``, :mod:`.parts`).
- ``POST /part``: a part of a query over a round held in parts (see :mod:`.parts`).

Objects may be models' parts (``<id>~<s>.<S>``, :mod:`cache_engine.keys`): a load reads only that
slice (from the cold store by ranged reads, or as a view of the update mapped in place).

Environment (no secret): ``FEDFAAS_FLSTORE_MINIO_ENDPOINT``, ``..._BUCKET`` (default ``fedfaas``), ``..._CAPACITY_BYTES`` (refuse loads beyond it; 0 = none),
``..._RUN_DELAY_S`` (fault injection in tests: hold every ``/run`` this long),
``..._GRAM_MEMO`` (``0``: no inner-product memo across queries, for benchmarks that compare
without it; default on), ``..._UTILITY_MEMO`` (``0``: no memo of evaluated sub-models across
queries; default on), ``..._GATEWAY_URL`` (the OpenFaaS gateway, to call a job's evaluator
function and the other cache functions through; the cache engine sets it),
``..._CALL_TIMEOUT_S`` (a reducer's wait for another function's part, default 120).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cache_engine.cold_store import (
    BUCKET,
    ColdStore,
    ColdStoreError,
    MinioColdStore,
    ObjectMissing,
    decode_object,
)
from cache_engine.evaluators import EvaluatorUnavailable, Layout, build_evaluator, layout_of
from cache_engine.keys import ObjectKey
from cache_engine.queries import run_sliced, run_workload
from core.memory import release_free_memory
from flstore_workloads import GramCache, WorkloadError  # imported at start, not on the first query
from flstore_workloads.sliced import part_bounds
from flstore_workloads.utility import UtilityCache

from .bodies import parse_keys as _keys
from .bodies import parse_offers as _offers
from .bodies import parse_slices as _slices
from .lending import Lending
from .memory import PrivateMemory, rss_anon
from .parts import Holdings, NotHeld, RemoteParts, serve
from .remote import PartFailed
from .remote import remote_part as _remote_part

log = logging.getLogger(__name__)

_ENV = "FEDFAAS_FLSTORE_"
_lock = threading.RLock()
_objects: dict[ObjectKey, Any] = {}
# each job's tensors (names and shapes, sorted), from the newest of its models loaded here
_layouts: dict[str, Layout] = {}
_store: ColdStore | None = None
# updates mapped in place from this node's gateways' stores, and their leases
_lending = Lending(_lock, _objects)
_handoffs = _lending.handoffs
_lent = _lending.lent
# cold stores on the engine's per-job grants, by access key (dropped once expired)
_granted: dict[str, tuple[MinioColdStore, float]] = {}
_stats = {
    "loads": 0,
    "evictions": 0,
    "runs": 0,
    "run_s": 0.0,
    "runs_in_flight": 0,  # under _lock
    "started": time.time(),
}
# inner products between held (sealed, read-only) vectors, kept across queries: the queries on a
# round share its Gram matrix; entries go with the vectors they were computed from
_grams: GramCache | None = (
    None if os.environ.get(_ENV + "GRAM_MEMO", "1").strip() == "0" else GramCache()
)
# utilities of sub-models evaluated here, kept across queries (contribution workloads)
_utilities: UtilityCache | None = (
    None if os.environ.get(_ENV + "UTILITY_MEMO", "1").strip() == "0" else UtilityCache()
)
_holdings = Holdings(lambda k: _held(k), lambda job, grants: _cold(job, grants), _grams)


def _cold(job: str, grants: Mapping[str, Any]) -> ColdStore:
    """The cold store that reads ``job``'s objects with the credentials the engine granted."""
    if _store is not None:
        return _store
    endpoint = os.environ.get(_ENV + "MINIO_ENDPOINT", "")
    if not endpoint:
        raise ColdStoreError("no cold store configured (FEDFAAS_FLSTORE_MINIO_ENDPOINT unset)")
    g = grants.get(job)
    keys = ("access_key", "secret_key", "session_token", "expires")
    if not isinstance(g, dict) or not all(g.get(k) for k in keys):
        raise ValueError(
            f"'credentials' has no grant for job {job!r}: an object {{access_key, secret_key, "
            "session_token, expires}} per job of 'objects', from the cache engine"
        )
    now = time.time()
    with _lock:
        for k in [k for k, (_, exp) in _granted.items() if exp <= now]:
            del _granted[k]
        hit = _granted.get(str(g["access_key"]))
        if hit is None:
            store = MinioColdStore(
                endpoint,
                str(g["access_key"]),
                str(g["secret_key"]),
                os.environ.get(_ENV + "BUCKET", BUCKET),
                session_token=str(g["session_token"]),
                create=False,
            )
            hit = _granted[str(g["access_key"])] = (store, float(g["expires"]))
    return hit[0]


def set_cold_store(store: ColdStore | None) -> None:
    """Use ``store`` for every job instead of MinIO with the engine's grants (handler tests)."""
    global _store
    _store = store
    _holdings.indexes.clear()  # the objects' tensor indexes were read from the other store


def _size(v: Any) -> int:
    return int(v.nbytes) if isinstance(v, np.ndarray) else len(json.dumps(v))


def _used() -> int:
    # under the lock: /ping and /run read it while a /load or /evict in another of the
    # watchdog's threads changes the dict (the soak saw "dictionary changed size": HTTP 500)
    with _lock:
        return sum(_size(v) for v in _objects.values())


def _held(key: ObjectKey) -> Any:
    with _lock:
        return _objects.get(key)


def _private_bytes() -> int:
    """This process's private memory (RssAnon): what the node's memory budget counts for a
    cache function (the updates it maps from the store are the store's pages)."""
    private = rss_anon()
    return _used() if private is None else private


def _held_private() -> int:
    """Bytes of the objects held in this process's own memory (not mapped from a store)."""
    with _lock:
        return sum(_size(v) for k, v in _objects.items() if k not in _lent)


# the private memory, and what of it is resting (not a request's working memory)
_memory = PrivateMemory(lambda: _private_bytes(), _held_private)


def _err(status: int, code: str, detail: str, **facts: Any) -> dict[str, Any]:
    return {
        "statusCode": status,
        "body": {"error": code, "detail": detail, **facts},
        "headers": {"Content-Type": "application/json"},
    }


def _ok(body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": 200, "body": body, "headers": {"Content-Type": "application/json"}}


def _status() -> dict[str, Any]:
    return {
        "function": os.environ.get("FEDFAAS_FUNCTION_NAME", "flstore-cache"),
        "pid": os.getpid(),
        # this replica's own address where its platform gives one (the embedded runtime): the
        # engine hands it to the request tracker, which then calls /run here directly
        "url": os.environ.get("FEDFAAS_REPLICA_URL") or None,
        "count": len(_objects),
        "objects_mapped": len(_lent),
        "bytes": _used(),
        **_memory.status(),
        "mapped_bytes": _lending.mapped_bytes(),
        "capacity_bytes": int(os.environ.get(_ENV + "CAPACITY_BYTES", "0") or 0),
        "gram_memo": _grams is not None,
        "gram_pairs": len(_grams) if _grams is not None else 0,
        "utility_memo": _utilities is not None,
        "utilities_kept": len(_utilities) if _utilities is not None else 0,
        "utilities_reused": _utilities.hits if _utilities is not None else 0,
        **_holdings.stats,
        **_stats,
    }


def _read(k: ObjectKey, grants: dict[str, Any]) -> Any:
    """``k`` from the cold store: a whole object, or a model's part by ranged reads."""
    store = _cold(k.job, grants)  # outside the lock: others keep running
    if k.parts:
        index = store.header(k.whole)
        a, b = part_bounds(index.numel, k.parts)[k.part]
        _layouts[k.job] = index.layout()
        return store.read_range(k.whole, a, b, index)
    data = store.get_bytes(k)
    value = decode_object(k, data)
    if k.kind != "meta":  # the newest model wins: a job created again may change it
        _layouts[k.job] = layout_of(data)
    return value


def _load(keys: list[ObjectKey], grants: Any, offers: list[dict[str, str]]) -> dict[str, Any]:
    if not isinstance(grants, dict):
        raise ValueError("'credentials' must be an object: job -> grant, from the cache engine")
    cap = int(os.environ.get(_ENV + "CAPACITY_BYTES", "0") or 0)
    loaded: list[str] = []
    already: list[str] = []
    lent = _lending.map(keys, offers) if offers else {}
    mapped = [k.id for k in lent]
    for k in keys:
        with _lock:
            if k in _objects:
                already.append(k.id)
                continue
        value = lent[k] if k in lent else _read(k, grants)
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value.setflags(write=False)  # sealed: what the Gram memo relies on
        with _lock:
            if cap and _used() + _size(value) > cap:
                unused = [x for x in lent if x not in _objects]
                leases = _lending.forget(unused)
                over = True
            else:
                _objects[k] = value
                _stats["loads"] += 1
                over = False
        if over:
            _lending.give_back(leases)
            return _err(
                507,
                "capacity_exceeded",
                f"loading {k.id} would exceed this function's capacity of {cap} "
                "bytes; evict objects first or use another function",
                loaded=loaded,
            )
        loaded.append(k.id)
        if k.kind == "meta" and isinstance(value, dict):
            spec = (value.get("round_meta") or {}).get("evaluator")
            if isinstance(spec, dict) and spec.get("kind") != "function":
                # build the job's in-process evaluator now, off the query path
                threading.Thread(target=_warm_evaluator, args=(spec,), daemon=True).start()
    if len(loaded) > len(mapped):  # the reads' buffers (parts under glibc's mmap threshold
        release_free_memory()  # stay in the heaps): the memory it reports follows what it holds
    return _ok({"loaded": loaded, "already": already, "mapped": mapped, **_status()})


def _warm_evaluator(spec: dict[str, Any]) -> None:
    try:
        build_evaluator(spec)
    except Exception as exc:  # reported again, as a 422, by the query that needs it
        log.warning("cannot build evaluator %s: %s", spec, exc)


def _name() -> str:
    return os.environ.get("FEDFAAS_FUNCTION_NAME", "flstore-cache")


def _evaluator(body: dict[str, Any], job: str | None) -> Any:
    layout = body.get("layout")
    if layout is not None:
        if not isinstance(layout, list) or not all(
            isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) for t in layout
        ):
            raise ValueError("'layout' must be [[tensor name, shape], ...], from the engine")
        return build_evaluator(
            body.get("evaluator"), tuple((str(n), tuple(int(d) for d in sh)) for n, sh in layout)
        )
    return build_evaluator(body.get("evaluator"), _layouts.get(job) if job else None)


def _compute(
    name: str, params: dict[str, Any], keys: list[ObjectKey], body: dict[str, Any], evaluator: Any
) -> Any:
    """The workload's result: on held objects, or (with ``slices``) as the reducer."""
    if body.get("slices") is None:
        with _lock:
            held = {k: _objects[k] for k in keys if k in _objects}
        return run_workload(name, params, held, evaluator, _grams, _utilities)
    dim, ranges, source = _slices(body)
    models = [k for k in keys if k.kind != "meta"]
    with _lock:
        metas = {k: _objects[k] for k in keys if k.kind == "meta" and k in _objects}
    for k in keys:  # past the budget nothing is kept: the metadata is read like the models
        if k.kind == "meta" and k not in metas and source is not None:
            metas[k] = _cold(k.job, source.get("credentials") or {}).get(k)
    parts = RemoteParts(
        ranges,
        [k.id for k in models],
        source,
        _name(),
        lambda b: serve(b, _holdings),
        _remote_part,
        _holdings.stats,
    )
    return run_sliced(name, params, models, dim, metas, evaluator, parts, _utilities)


#: a query whose models held here take at least this many bytes (or one over parts) frees what
#: it built before it answers; a collection costs ~0.1 s with torch loaded, which a query on a
#: small model (the digits job's leave-one-out: ~10 ms) would pay on every answer
TIDY_BYTES = 16 << 20


def _tidies(body: dict[str, Any]) -> bool:
    """Whether the query ``body`` built enough (sub-models, streamed chunks) that what a
    reference cycle still holds should go now, and the heaps' pages back (core.memory)."""
    if body.get("slices") is not None:
        return True
    if body.get("evaluator") is None:
        return False
    ids = body.get("objects")
    wanted = {i for i in ids if isinstance(i, str)} if isinstance(ids, list) else set()
    with _lock:
        held = sum(_size(v) for k, v in _objects.items() if k.id in wanted and k.kind != "meta")
    return held >= TIDY_BYTES


def _run(body: dict[str, Any]) -> dict[str, Any]:
    with _lock:
        _stats["runs_in_flight"] += 1
    try:
        return _run_query(body)
    finally:
        with _lock:
            _stats["runs_in_flight"] -= 1
        if _tidies(body):
            gc.collect()
            release_free_memory()


def _run_query(body: dict[str, Any]) -> dict[str, Any]:
    name = body.get("workload")
    params = body.get("params") or {}
    if not isinstance(name, str) or not isinstance(params, dict):
        return _err(400, "bad_request", "'workload' must be a string and 'params' an object")
    keys = _keys(body)
    sl = body.get("slices")
    here = keys if sl is None else [k for k in keys if k.kind == "meta"]
    if isinstance(sl, dict) and sl.get("source") is not None:
        here = []  # read from the cold store
    with _lock:
        missing = [k.id for k in here if k not in _objects]
    if missing:
        return _err(
            409,
            "not_held",
            "this function does not hold every object of the query; "
            "ask the cache engine to load them",
            missing=missing,
            function=_name(),
        )
    delay = float(os.environ.get(_ENV + "RUN_DELAY_S", "0") or 0)
    if delay > 0:  # fault injection for tests: keeps a query in flight
        time.sleep(delay)
    t0 = time.perf_counter()
    try:
        evaluator = _evaluator(body, keys[0].job if keys else None)
    except EvaluatorUnavailable as exc:
        return _err(422, "no_evaluator", str(exc))
    try:
        result = _compute(name, params, keys, body, evaluator)
    except WorkloadError as exc:
        return {
            "statusCode": int(getattr(exc, "status", 400)),
            "body": exc.to_dict(),
            "headers": {"Content-Type": "application/json"},
        }
    except EvaluatorUnavailable as exc:  # the job's evaluator function failed mid-query
        return _err(502, "evaluator_failed", str(exc))
    except NotHeld as exc:  # this function's own part
        return _err(409, "not_held", str(exc), missing=exc.missing, function=_name())
    except PartFailed as exc:  # another function's part
        if exc.status == 409 and exc.body.get("error") == "not_held":
            return _err(
                409,
                "not_held",
                str(exc),
                missing=exc.body.get("missing", []),
                function=exc.function,
            )
        return _err(502, "part_failed", str(exc), function=exc.function)
    spent = time.perf_counter() - t0
    _stats["runs"] += 1
    _stats["run_s"] += spent
    return _ok({"result": result, "compute_s": spent, "function": _name()})


def _part(body: dict[str, Any]) -> dict[str, Any]:
    try:
        raw = serve(body, _holdings)
    except NotHeld as exc:
        return _err(409, "not_held", str(exc), missing=exc.missing, function=_name())
    if body.get("source") is not None or len(raw) > 16 << 20:
        gc.collect()  # the chunks streamed, the rows built (see _run)
        release_free_memory()
    return {
        "statusCode": 200,
        "body": raw,
        "headers": {"Content-Type": "application/octet-stream"},
    }


def _serve(path: str, body: dict[str, Any]) -> dict[str, Any]:
    if path == "/load":
        return _load(_keys(body), body.get("credentials", {}), _offers(body.get("handoff")))
    if path == "/evict":
        keys = _keys(body)
        with _lock:
            gone = [k.id for k in keys if _objects.pop(k, None) is not None]
            leases = _lending.forget(keys)
            _stats["evictions"] += len(gone)
        _lending.give_back(leases)  # as soon as no key held here maps the update
        if gone:  # the heaps would keep the freed pages (see core.memory)
            release_free_memory()
        return _ok({"evicted": gone, **_status()})
    if path == "/part":
        return _part(body)
    return _run(body)


def handle(event: Any, context: Any) -> dict[str, Any]:
    """Route one request (python3-http contract)."""
    path = (event.path or "/").rstrip("/") or "/"
    method = event.method.upper()
    try:
        if method == "GET" and path in ("/", "/ping", "/healthz"):
            return _ok({"ok": True, **_status()})
        if method == "GET" and path == "/objects":
            with _lock:
                objs = [{"id": k.id, "bytes": _size(v)} for k, v in _objects.items()]
            return _ok({"objects": objs, **_status()})
        if method != "POST" or path not in ("/load", "/evict", "/run", "/part"):
            return _err(
                404,
                "no_route",
                f"no route {method} {path}; routes: GET /ping, "
                "GET /objects, POST /load, POST /evict, POST /run, POST /part",
            )
        try:
            body = json.loads(event.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            return _err(400, "bad_json", "the request body must be a JSON object")
        if not isinstance(body, dict):
            return _err(400, "bad_json", "the request body must be a JSON object")
        with _memory.serving():  # its working memory is not what the function holds
            return _serve(path, body)
    except ValueError as exc:
        return _err(400, "bad_request", str(exc))
    except ObjectMissing as exc:
        return _err(404, "object_missing", str(exc), path=exc.path)
    except ColdStoreError as exc:
        return _err(503, "cold_store", str(exc))
