"""FLStore cache function (``flstore-cache-N``): holds FL objects in memory and runs workloads.

One function per cache shard, created and removed by the cache engine through the provider API.
Objects are client updates and global models (flat float32 numpy vectors, tensors in sorted-name
order) and round metadata (dicts), loaded from the cold store (MinIO) when the engine says so.

Routes (python3-http contract; JSON in and out; bad input gets a 4xx ``{"error", "detail"}``):

- ``GET /ping``: liveness and memory use.
- ``GET /objects``: holdings with sizes.
- ``POST /load`` ``{"objects": ["<job>/<round>/<client|global|meta>", ...], "credentials":
  {"<job>": {"access_key", "secret_key", "session_token", "expires"}}, "handoff"?: [{"socket",
  "ticket", "node"}]}``: load from MinIO. The function has no MinIO user of its own: the cache
  engine sends, with each load, temporary credentials that read only the objects of each job
  named (see :meth:`cache_engine.cold_store.MinioColdStore.job_credentials`). Updates of a
  round a ``handoff`` names are first claimed from that gateway's store
  (:mod:`fedfaas.objstore.handoff`): mapped read-only in place, no copy, each kept alive by a
  lease until evicted here; a gateway this function cannot reach (another node) or an offer
  gone leaves them to MinIO. The answer's ``mapped`` lists the objects mapped in place. Should
  the gateway go away, its objects are dropped at once (a later query gets 409 ``not_held``
  and the engine loads them again).
- ``POST /evict`` ``{"objects": [...]}``: drop objects and give their memory back to the OS
  (:func:`fedfaas.memory.release_free_memory`), so memory follows the bytes held; an object
  mapped from a gateway's store gives its lease back.
- ``POST /run`` ``{"workload", "params", "objects": [...], "evaluator"?}``: run a workload on
  held objects (``evaluator``: the job's validation-set spec, see cache_engine.evaluators; a
  ``function`` evaluator gets the models as safetensors of the job's tensors, whose names and
  shapes this function keeps from the newest model of the job it loaded).

Environment (no secret): ``FEDFAAS_FLSTORE_MINIO_ENDPOINT``, ``..._BUCKET`` (default ``fedfaas``), ``..._CAPACITY_BYTES`` (refuse loads beyond it; 0 = none),
``..._RUN_DELAY_S`` (fault injection in tests: hold every ``/run`` this long),
``..._GRAM_MEMO`` (``0``: no inner-product memo across queries, for benchmarks that compare
without it; default on), ``..._GATEWAY_URL`` (the OpenFaaS gateway, to call a job's evaluator
function through; the cache engine sets it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
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
from cache_engine.queries import run_workload
from fedfaas.memory import release_free_memory
from fedfaas.objstore import StoreError
from fedfaas.objstore.handoff import HandoffClient, HandoffError
from fedfaas.wire import HEADER_SIZE, KIND_UPDATE, WireError, read_header
from fedfaas.workloads import GramCache, WorkloadError  # imported at start, not on the first query

log = logging.getLogger(__name__)

_ENV = "FEDFAAS_FLSTORE_"
_lock = threading.RLock()
_objects: dict[ObjectKey, Any] = {}
# each job's tensors (names and shapes, sorted), from the newest of its models loaded here
_layouts: dict[str, Layout] = {}
_store: ColdStore | None = None
# connections to this node's gateways' handoff sockets, by path
_handoffs: dict[str, HandoffClient] = {}
# objects mapped in place from a gateway's store -> (its socket, the ticket, the client)
_lent: dict[ObjectKey, tuple[str, str, str]] = {}
# cold stores on the engine's per-job grants, by access key (dropped once expired)
_granted: dict[str, tuple[MinioColdStore, float]] = {}
_stats = {"loads": 0, "evictions": 0, "runs": 0, "started": time.time()}
# inner products between held (sealed, read-only) vectors, kept across queries: the queries on a
# round share its Gram matrix; entries go with the vectors they were computed from
_grams: GramCache | None = (
    None if os.environ.get(_ENV + "GRAM_MEMO", "1").strip() == "0" else GramCache()
)


def _cold(job: str, grants: dict[str, Any]) -> ColdStore:
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


def _size(v: Any) -> int:
    return int(v.nbytes) if isinstance(v, np.ndarray) else len(json.dumps(v))


def _used() -> int:
    # under the lock: /ping and /run read it while a /load or /evict in another of the
    # watchdog's threads changes the dict (the soak saw "dictionary changed size": HTTP 500)
    with _lock:
        return sum(_size(v) for v in _objects.values())


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
        "capacity_bytes": int(os.environ.get(_ENV + "CAPACITY_BYTES", "0") or 0),
        "gram_memo": _grams is not None,
        "gram_pairs": len(_grams) if _grams is not None else 0,
        **_stats,
    }


def _keys(body: dict[str, Any]) -> list[ObjectKey]:
    raw = body.get("objects")
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ValueError("'objects' must be a list of object ids '<job>/<round>/<client|kind>'")
    try:
        return [ObjectKey.parse(x) for x in raw]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"bad object id in 'objects': {exc}") from None


def _offers(raw: Any) -> list[dict[str, str]]:
    if raw is None:
        return []
    ok = isinstance(raw, list) and all(
        isinstance(h, dict) and all(isinstance(h.get(f), str) for f in ("socket", "ticket"))
        for h in raw
    )
    if not ok:
        raise ValueError("'handoff' must be a list of {socket, ticket, node}, from the engine")
    return list(raw)


def _handoff_client(path: str) -> HandoffClient:
    """The one connection to the gateway at ``path`` (made under the lock, so two loads at
    once never open two: a second one's claims would outlive its dropped client)."""
    with _lock:
        c = _handoffs.get(path)
        if c is None or c.lost.is_set():
            c = _handoffs[path] = HandoffClient(path, _gateway_lost)  # a local connect
        return c


def _gateway_lost(client: HandoffClient) -> None:
    """A gateway we map objects from went away (its leases with it): drop them all now."""
    with _lock:
        if _handoffs.get(str(client.path)) is client:
            del _handoffs[str(client.path)]
        gone = [k for k, (p, _, _) in _lent.items() if p == str(client.path)]
        for k in gone:
            del _lent[k]
            _objects.pop(k, None)
    log.warning("gateway handoff %s closed: dropped %d mapped objects", client.path, len(gone))


def _map_lent(keys: list[ObjectKey], offers: list[dict[str, str]]) -> dict[ObjectKey, Any]:
    """The updates among ``keys`` that an offer lends, mapped read-only in place; what this
    function cannot claim (another node's gateway, an offer gone) is left to MinIO."""
    out: dict[ObjectKey, Any] = {}
    for h in offers:
        try:
            client = _handoff_client(h["socket"])
            claim = client.claim(h["ticket"])
        except HandoffError as exc:
            log.info("handoff %s not claimed (%s): MinIO instead", h["socket"], exc)
            continue
        wanted = {
            k.client: k
            for k in keys
            if k.kind == "update" and (k.job, k.round) == (claim.job, claim.round)
        }
        unwanted: list[str] = []
        for name, key in claim.objects.items():
            k = wanted.get(name)
            if name not in claim.held:
                continue  # given back before: the object may be gone, MinIO has it
            with _lock:
                if k is not None and _lent.get(k, ("", "", ""))[1] == claim.ticket:
                    continue  # mapped before under this very lease
                if k is not None and k not in _objects and k not in out:
                    try:
                        obj = claim.store.open(key)
                        head = read_header(obj.buf)
                        if head.kind != KIND_UPDATE or head.spec_hash.hex() != claim.spec_hash:
                            raise WireError(f"object {key} is not an update of the job's spec")
                    except (WireError, StoreError, OSError, ValueError) as exc:
                        log.warning("handoff object %s of %s unreadable: %s", key, k.id, exc)
                    else:
                        x = np.frombuffer(obj.buf, np.float32, claim.numel, HEADER_SIZE)
                        out[k] = x  # the buffer is read-only: so is the vector
                        _lent[k] = (h["socket"], claim.ticket, name)
                        continue
            unwanted.append(name)
        if unwanted:  # not wanted here (or unreadable): their leases go back at once, together
            with contextlib.suppress(HandoffError):
                client.release(claim.ticket, unwanted)
    return out


def _give_back(gone: list[tuple[str, str, str]]) -> None:
    for path, ticket, name in gone:
        with _lock:
            client = _handoffs.get(path)
        if client is None:
            continue
        try:
            client.release(ticket, [name])
        except HandoffError as exc:  # the gateway is gone: its leases went with it
            log.info("handoff release of %s on %s: %s", name, path, exc)


def _load(keys: list[ObjectKey], grants: Any, offers: list[dict[str, str]]) -> dict[str, Any]:
    if not isinstance(grants, dict):
        raise ValueError("'credentials' must be an object: job -> grant, from the cache engine")
    cap = int(os.environ.get(_ENV + "CAPACITY_BYTES", "0") or 0)
    loaded: list[str] = []
    already: list[str] = []
    lent = _map_lent(keys, offers) if offers else {}
    mapped = [k.id for k in lent]
    for k in keys:
        with _lock:
            if k in _objects:
                already.append(k.id)
                continue
        if k in lent:
            value: Any = lent[k]
        else:
            data = _cold(k.job, grants).get_bytes(k)  # outside the lock: others keep running
            value = decode_object(k, data)
            if k.kind != "meta":  # the newest model wins: a job created again may change it
                _layouts[k.job] = layout_of(data)
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value.setflags(write=False)  # sealed: what the Gram memo relies on
        with _lock:
            if cap and _used() + _size(value) > cap:
                unused = [_lent.pop(x) for x in lent if x not in _objects and x in _lent]
                _give_back(unused)
                return _err(
                    507,
                    "capacity_exceeded",
                    f"loading {k.id} would exceed this function's capacity of {cap} "
                    "bytes; evict objects first or use another function",
                    loaded=loaded,
                )
            _objects[k] = value
            _stats["loads"] += 1
        loaded.append(k.id)
        if k.kind == "meta" and isinstance(value, dict):
            spec = (value.get("round_meta") or {}).get("evaluator")
            if isinstance(spec, dict) and spec.get("kind") != "function":
                # build the job's in-process evaluator now, off the query path
                threading.Thread(target=_warm_evaluator, args=(spec,), daemon=True).start()
    return _ok({"loaded": loaded, "already": already, "mapped": mapped, **_status()})


def _warm_evaluator(spec: dict[str, Any]) -> None:
    try:
        build_evaluator(spec)
    except Exception as exc:  # reported again, as a 422, by the query that needs it
        log.warning("cannot build evaluator %s: %s", spec, exc)


def _run(body: dict[str, Any]) -> dict[str, Any]:
    name = body.get("workload")
    params = body.get("params") or {}
    if not isinstance(name, str) or not isinstance(params, dict):
        return _err(400, "bad_request", "'workload' must be a string and 'params' an object")
    keys = _keys(body)
    with _lock:
        missing = [k.id for k in keys if k not in _objects]
        held = {k: _objects[k] for k in keys if k in _objects}
    if missing:
        return _err(
            409,
            "not_held",
            "this function does not hold every object of the query; "
            "ask the cache engine to load them",
            missing=missing,
        )
    delay = float(os.environ.get(_ENV + "RUN_DELAY_S", "0") or 0)
    if delay > 0:  # fault injection for tests: keeps a query in flight
        time.sleep(delay)
    t0 = time.perf_counter()
    try:
        evaluator = build_evaluator(
            body.get("evaluator"), _layouts.get(keys[0].job) if keys else None
        )
    except EvaluatorUnavailable as exc:
        return _err(422, "no_evaluator", str(exc))
    try:
        result = run_workload(name, params, held, evaluator, _grams)
    except WorkloadError as exc:
        return {
            "statusCode": int(getattr(exc, "status", 400)),
            "body": exc.to_dict(),
            "headers": {"Content-Type": "application/json"},
        }
    except EvaluatorUnavailable as exc:  # the job's evaluator function failed mid-query
        return _err(502, "evaluator_failed", str(exc))
    _stats["runs"] += 1
    return _ok(
        {"result": result, "compute_s": time.perf_counter() - t0, "function": _status()["function"]}
    )


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
        if method != "POST" or path not in ("/load", "/evict", "/run"):
            return _err(
                404,
                "no_route",
                f"no route {method} {path}; routes: GET /ping, "
                "GET /objects, POST /load, POST /evict, POST /run",
            )
        try:
            body = json.loads(event.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            return _err(400, "bad_json", "the request body must be a JSON object")
        if not isinstance(body, dict):
            return _err(400, "bad_json", "the request body must be a JSON object")
        if path == "/load":
            return _load(_keys(body), body.get("credentials", {}), _offers(body.get("handoff")))
        if path == "/evict":
            keys = _keys(body)
            with _lock:
                gone = [k.id for k in keys if _objects.pop(k, None) is not None]
                leases = [_lent.pop(k) for k in keys if k in _lent]
                _stats["evictions"] += len(gone)
            _give_back(leases)
            if gone:  # the heaps would keep the freed pages (see fedfaas.memory)
                release_free_memory()
            return _ok({"evicted": gone, **_status()})
        return _run(body)
    except ValueError as exc:
        return _err(400, "bad_request", str(exc))
    except ObjectMissing as exc:
        return _err(404, "object_missing", str(exc), path=exc.path)
    except ColdStoreError as exc:
        return _err(503, "cold_store", str(exc))
