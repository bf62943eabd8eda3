"""Aggregator endpoints: take grants, receive TASK/UPDATE/PARTIAL frames, fold, report up.

Each :class:`EndpointWorker` is one registered endpoint (a thread) holding at most one task
at a time; a replica runs several to serve several slots (``FEDFAAS_AGGREGATOR_ENDPOINTS``).
An endpoint registers job-agnostic and serves whatever job the node gateway grants it (a GRANT
frame carrying the job's store folder as a directory fd); a later grant moves the same warm
endpoint to another job (LIFL's reuse). The job's arena (its pool of objects, one file) is
mapped once per replica: whole and read-only, and each slot read-write the first time one of its
endpoints writes there (the endpoints share the mappings: ``StoreClient.from_dir_fd(shared=True)``),
so an update or partial named in a frame is read in place with no open, mmap or page fault
once its slot was mapped, and folded into the task's accumulator object in one pass each
(``core.fedavg``); the top divides once, in the pass of its last fold, on the replica's
cores. Frame protocol: ``gateway/rounds.py``.

A secure-aggregation job's TASK carries ``FLAG_MASKED``: its objects are masked uint32 vectors
(``core.secagg``), read as uint32 views and folded with :class:`~core.secagg.fold.MaskedAccumulator`
(wrapping addition, no weights in the arithmetic), eagerly on the same leaf/middle/top path and
with the same checkpoints; the top divides nothing: its result is the masked sum, unmasked by the
round's coordinator.

A middle or top (eager) checkpoints after each child's partial it folds: it seals its
accumulator, reports it to the gateway (CHECKPOINT) and writes nothing more until the gateway
sends a spare object (SPARE), into which it folds the next partial in the same single pass
(``Accumulator.merge_into``); or a new TASK, which drops the parked one. A re-run gets its
checkpoint first and reads it in place the same way. So the gateway can free every partial a
journaled checkpoint covers, and a node's memory does not grow with its leaves.

An object a frame names that the endpoint cannot use (not in the store, truncated, another
model: :class:`bpf.Failure`) is never skipped in silence: the endpoint logs it at ERROR with
the key and answers the gateway a FAILED frame naming it (``gateway/rounds.py`` says what the
gateway does then); the frame's work is not done.

Runs inside the ``aggregator`` function (``handler.py`` starts the endpoints on import).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import bpf
from bpf import Failure, Frame, Kind, Role
from core import fedavg, robust, shards, wire
from core.fedavg import Accumulator, LazyAccumulator
from core.objstore import MappedObject, ObjectNotFound, StoreClient, StoreError
from core.secagg.fold import MaskedAccumulator

from .settings import AggregatorSettings

log = logging.getLogger("fedfaas.aggregator")

#: "numpy" (default: blocked axpy, ~30 MB per process) or "torch" (fused add_, ~300 MB of
#: private memory for the CUDA-enabled torch import); see core/fedavg.py.
_SETTINGS = AggregatorSettings()
KERNEL = _SETTINGS.kernel
#: the top folds its coordinates on this many threads (see AggregatorSettings.top_threads)
TOP_THREADS = _SETTINGS.top_threads


def _flat(obj: MappedObject) -> Any:
    """The object's data region as a float32 vector view, for the configured kernel."""
    n = (obj.nbytes - wire.HEADER_SIZE) // 4
    if KERNEL == "torch":
        return obj.tensor(offset=wire.HEADER_SIZE, count=n)
    return obj.ndarray(np.float32, wire.HEADER_SIZE, n)


def _masked(obj: MappedObject) -> np.ndarray:
    """The object's data region as a uint32 vector view (a masked vector or sum of them)."""
    return obj.ndarray(np.uint32, wire.HEADER_SIZE, (obj.nbytes - wire.HEADER_SIZE) // 4)


def _floats(obj: MappedObject) -> np.ndarray:
    """The object's data region as a float32 numpy view (the shard kernels are numpy)."""
    return obj.ndarray(np.float32, wire.HEADER_SIZE, (obj.nbytes - wire.HEADER_SIZE) // 4)


class UnusableObject(Exception):
    """An object a frame names cannot be used: ``key`` (its 16 bytes), ``why`` (a
    :class:`bpf.Failure`), ``detail`` (what was found)."""

    def __init__(self, key: bytes, why: Failure, detail: str = "") -> None:
        self.key, self.why, self.detail = key, why, detail
        super().__init__(f"object {key.hex()} {why.describe()}" + (f": {detail}" if detail else ""))


@dataclass
class _Task:
    round: int
    slot: int
    role: int
    goal: int
    lazy: bool
    parent_ep: int
    parent_slot: int
    gateway_ep: int
    acc_obj: MappedObject
    acc: Any
    spec_hash: bytes | None = None
    seen_updates: set[bytes] = field(default_factory=set)
    seen_children: set[int] = field(default_factory=set)
    held: list[MappedObject] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    #: the accumulator is sealed as a checkpoint: the next fold writes into a spare
    sealed: bool = False
    spares: deque[bytes] = field(default_factory=deque)
    #: partials that arrived while sealed and without a spare, folded when one comes
    waiting: deque[Frame] = field(default_factory=deque)
    #: secure aggregation: uint32 views, the Z_2^32 fold, no division
    masked: bool = False

    def view(self, obj: MappedObject) -> Any:
        """``obj``'s data region as this task's accumulator reads it."""
        return _masked(obj) if self.masked else _flat(obj)

    @property
    def checkpoints(self) -> bool:
        """Eager middles and tops checkpoint after each child's partial."""
        return not self.lazy and self.role != Role.LEAF


class EndpointWorker(threading.Thread):
    """One aggregator endpoint serving the tasks of whichever job it is granted, until :meth:`stop`."""

    def __init__(self, socket_path: str, *, name: str = "aggregator") -> None:
        super().__init__(name=f"agg-{name}", daemon=True)
        self.socket_path = socket_path
        self.job_id = 0
        self.store: StoreClient | None = None
        self.jobs_served: list[int] = []
        self.role_name = name
        self.endpoint: bpf.Endpoint | None = None
        self.tasks_done = 0
        self.folded = 0
        self.last_error = ""
        self._task: _Task | None = None
        self._halt = threading.Event()
        self.ready = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def status(self) -> dict[str, Any]:
        t = self._task
        return {
            "endpoint": self.endpoint.id if self.endpoint else None,
            "job": self.job_id,
            "jobs_served": list(self.jobs_served),
            "tasks_done": self.tasks_done,
            "folded": self.folded,
            "last_error": self.last_error,
            # the granted job's arena: mappings made (shared by the replica's endpoints)
            "arena_maps": None
            if self.store is None
            else {"whole": self.store.arena_remaps, "slots": self.store.arena_writable_maps},
            "task": None
            if t is None
            else {"round": t.round, "slot": t.slot, "goal": t.goal, "count": t.acc.count},
        }

    def run(self) -> None:
        """Register, serve, and register again whenever the router goes away (gateway restart)."""
        delay = 0.2
        while not self._halt.is_set():
            try:
                self.endpoint = bpf.connect(self.socket_path, self.role_name)
            except (OSError, bpf.RouterError) as exc:
                self.last_error = f"cannot register: {exc}"
                self.ready.set()
                log.debug("aggregator: %s; retrying in %.1fs", self.last_error, delay)
                self._halt.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.2
            self.last_error = ""
            self.ready.set()
            self._serve(self.endpoint)
            self._take_grant(0, None)  # a new registration starts in no job

    def _serve(self, ep: bpf.Endpoint) -> None:
        log.info("aggregator endpoint %d registered (pid %d)", ep.id, os.getpid())
        try:
            while not self._halt.is_set():
                f = ep.recv(timeout=0.5)
                if f is None:
                    continue
                try:
                    self._handle(ep, f)
                except bpf.EndpointClosed:
                    raise
                except UnusableObject as exc:
                    self._report(ep, f, exc)
                except Exception as exc:  # keep serving: one bad frame must not kill the endpoint
                    self.last_error = repr(exc)
                    log.exception("aggregator endpoint %d: %s frame failed", ep.id, f.kind.name)
        except bpf.EndpointClosed:
            log.info("aggregator endpoint %d: router closed; registering again", ep.id)
        finally:
            self._drop_task()
            ep.close()

    def _report(self, ep: bpf.Endpoint, f: Frame, exc: UnusableObject) -> None:
        """Tell the gateway (and the log) that ``f``'s work was not done, naming the object."""
        t = self._task
        # TASK and SHARD come from the gateway; a PARTIAL may come from a child endpoint
        dst = f.src if t is None or f.kind in (Kind.TASK, Kind.SHARD) else t.gateway_ep
        slot = f.parent if f.kind == Kind.PARTIAL else f.seq
        self.last_error = str(exc)
        log.error(
            "aggregator endpoint %d: %s frame of job %d round %d (slot or shard %d) not done: "
            "%s; reported to endpoint %d",
            ep.id,
            f.kind.name,
            self.job_id,
            f.round,
            slot,
            exc,
            dst,
        )
        ep.send(
            Frame(
                dst=dst,
                src=0,
                kind=Kind.FAILED,
                flags=int(f.kind),
                job=self.job_id,
                key=exc.key,
                round=f.round,
                count=int(exc.why),
                seq=slot,
            )
        )

    def _open(self, key: bytes, *, writable: bool = False) -> MappedObject:
        """Map object ``key`` of the granted job's store, or :class:`UnusableObject`."""
        assert self.store is not None
        try:
            return self.store.open_writable(key) if writable else self.store.open(key)
        except ObjectNotFound:
            raise UnusableObject(key, Failure.MISSING) from None
        except (StoreError, OSError, ValueError) as exc:  # ValueError: an empty file's mmap
            raise UnusableObject(key, Failure.UNREADABLE, str(exc)) from None

    # -- frames --------------------------------------------------------------------------------
    def _take_grant(self, job: int, store_fd: int | None) -> None:
        self._drop_task()
        if self.store is not None:
            self.store.close()  # the previous job's arena: its pages are not held on our account
        self.job_id = job
        # the job's whole pool, mapped once per replica (its endpoints share the mappings):
        # every object handed over later is read in place, every slot written is mapped once
        self.store = None if store_fd is None else StoreClient.from_dir_fd(store_fd, shared=True)
        if job and (not self.jobs_served or self.jobs_served[-1] != job):
            self.jobs_served.append(job)

    def _handle(self, ep: bpf.Endpoint, f: Frame) -> None:
        if f.kind == Kind.GRANT:
            self._take_grant(f.job, ep.store_fd)
            log.debug("aggregator endpoint %d now serves job %d", ep.id, f.job)
            return
        if self.store is None or f.job != self.job_id:
            log.debug("endpoint %d: %s for job %d without a grant", ep.id, f.kind.name, f.job)
            return
        if f.kind == Kind.TASK:
            self._drop_task()
            obj = self._open(f.key, writable=True)  # the gateway allocated it for this task
            threads = TOP_THREADS if f.flags & 0xFF == Role.TOP else 1
            acc: Any
            if f.masked:  # folded eagerly even in a lazy round: a sum needs no held inputs
                acc = MaskedAccumulator(_masked(obj))
            elif f.lazy:
                acc = LazyAccumulator(_flat(obj))
            else:
                acc = Accumulator(_flat(obj), threads=threads)
            self._task = _Task(
                f.round,
                f.seq,
                f.flags & 0xFF,
                f.count,
                f.lazy,
                f.parent,
                int(f.weight),
                f.src,
                obj,
                acc,
                masked=f.masked,
            )
            return
        if f.kind == Kind.SHUTDOWN:
            self._halt.set()
            return
        if f.kind == Kind.SHARD:
            self._shard(ep, f)
            return
        t = self._task
        if t is None or f.round != t.round:
            log.debug("endpoint %d: %s for round %d without a task", ep.id, f.kind.name, f.round)
            return
        if f.kind == Kind.SPARE:
            if f.seq == t.slot:
                t.spares.append(f.key)
                while t.waiting and t.spares and self._task is t:
                    self._take_partial(ep, t, t.waiting.popleft())
            return
        if f.kind == Kind.UPDATE and f.seq == t.slot and f.key not in t.seen_updates:
            t.seen_updates.add(f.key)
            self._fold(t, f, partial=False)
            if t.acc.count >= t.goal:
                self._finish(ep, t)
        elif f.kind == Kind.PARTIAL and f.parent == t.slot and f.seq not in t.seen_children:
            t.seen_children.add(f.seq)
            if t.sealed and not t.spares:
                t.waiting.append(f)  # folded when the gateway's SPARE arrives
            else:
                self._take_partial(ep, t, f)

    def _shard(self, ep: bpf.Endpoint, f: Frame) -> None:
        """Shard ``f.seq`` of the pass manifest ``f.key`` names: read the range of every
        update in place, write its Gram block into the manifest or its range of the output
        object, answer SHARD_DONE (see ``core/shards.py`` and ``gateway/sharded.py``)."""
        assert self.store is not None
        t0 = time.perf_counter()
        opened: list[MappedObject] = []
        try:
            man = self._open(f.key, writable=True)
            opened.append(man)
            try:
                p = shards.read(man.buf)
            except (ValueError, struct.error) as exc:
                raise UnusableObject(f.key, Failure.UNREADABLE, str(exc)) from None
            lo, hi = p.bounds[f.seq], p.bounds[f.seq + 1]
            base = self._open(p.global_key)  # the job's model: every input is its size
            opened.append(base)
            ups = []
            for k in p.inputs:
                opened.append(self._open(k))
                if opened[-1].nbytes != base.nbytes:
                    raise UnusableObject(
                        k,
                        Failure.UNREADABLE,
                        f"{opened[-1].nbytes} bytes, the model's {base.nbytes}",
                    )
                ups.append(_floats(opened[-1]))
            if p.kind == shards.ORDER:
                out = self._open(p.out_key, writable=True)
                opened.append(out)
                robust.reduce_order(robust.RobustRule.from_json(p.rule), ups, lo, hi, _floats(out))
            else:
                g = _floats(base)
                if p.kind == shards.GRAM:
                    norms = robust.RobustRule.from_json(p.rule).norms_only
                    gram = robust.gram_shard(ups, g, lo, hi, diagonal=norms)
                    shards.results(man.buf, p)[f.seq] = gram
                else:
                    out = self._open(p.out_key, writable=True)
                    opened.append(out)
                    coef = np.asarray(p.coef, dtype=np.float64)
                    robust.reduce_linear(coef, ups, g, lo, hi, _floats(out), p.noise)
            del ups
        finally:
            for o in opened:
                o.close()
        self.tasks_done += 1
        ep.send(
            Frame(
                dst=f.src,
                src=0,
                kind=Kind.SHARD_DONE,
                flags=f.flags,
                job=self.job_id,
                key=f.key,
                round=f.round,
                seq=f.seq,
            )
        )
        log.debug(
            "endpoint %d: shard %d (%s) of round %d done in %.1f ms",
            ep.id,
            f.seq,
            shards.PASSES.get(f.flags, "?"),
            f.round,
            (time.perf_counter() - t0) * 1e3,
        )

    def _take_partial(self, ep: bpf.Endpoint, t: _Task, f: Frame) -> None:
        if f.seq == t.slot and t.checkpoints and t.acc.count == 0 and f.count < t.goal:
            self._start_from_checkpoint(t, f)
            return
        self._fold(t, f, partial=True)
        if t.acc.count >= t.goal:
            self._finish(ep, t)
        elif t.checkpoints and f.seq != t.slot:  # (seq == slot: the checkpoint of a re-run)
            self._checkpoint(ep, t, child=f.seq)

    def _open_input(self, t: _Task, key: bytes) -> MappedObject:
        """A sealed update, partial or checkpoint of task ``t``, checked: a store object of
        the task's size and model spec, or :class:`UnusableObject`."""
        obj = self._open(key)
        try:
            h = wire.read_header(obj.buf)
        except (wire.WireError, struct.error) as exc:
            obj.close()
            raise UnusableObject(key, Failure.UNREADABLE, str(exc)) from None
        if obj.nbytes != t.acc_obj.nbytes:
            obj.close()
            raise UnusableObject(
                key, Failure.UNREADABLE, f"{obj.nbytes} bytes, the task's are {t.acc_obj.nbytes}"
            )
        if t.spec_hash is None:
            t.spec_hash = h.spec_hash
        if h.spec_hash != t.spec_hash:
            obj.close()
            raise UnusableObject(key, Failure.OTHER_MODEL, "its spec hash differs")
        return obj

    def _start_from_checkpoint(self, t: _Task, f: Frame) -> None:
        """A re-run's own checkpoint: read in place as the sealed accumulator; the task's
        fresh object becomes the spare the next partial is folded into."""
        base = self._open_input(t, f.key)
        fresh = t.acc_obj
        if t.masked:
            t.acc = MaskedAccumulator(_masked(base), float(f.weight), int(f.count), _empty=False)
        else:
            t.acc = Accumulator(
                _flat(base), float(f.weight), int(f.count), _empty=False, threads=t.acc.threads
            )
        t.acc_obj, t.sealed = base, True
        t.spares.append(fresh.key_bytes)
        fresh.close()

    def _fold(self, t: _Task, f: Frame, *, partial: bool) -> None:
        assert self.store is not None
        obj = self._open_input(t, f.key)
        view = t.view(obj)
        # the top's last input: the sum and the division in one pass (a masked sum: no division)
        final = t.role == Role.TOP and not t.lazy and t.acc.count + f.count >= t.goal
        if partial and t.sealed:
            # the accumulator is a sealed checkpoint: read it, write the sum into a spare
            spare = self._open(t.spares.popleft(), writable=True)
            sealed_obj = t.acc_obj
            t.acc = t.acc.merge_into(t.view(spare), view, f.weight, f.count, final=final)
            t.acc_obj, t.sealed = spare, False
            sealed_obj.close()
        elif partial and final:
            t.acc.merge(view, f.weight, f.count, final=True)
        elif partial:
            t.acc.merge(view, f.weight, f.count)
        else:
            t.acc.add(view, f.weight)
        self.folded += 1
        if t.lazy and not t.masked:
            t.held.append(obj)  # views stay valid until the lazy fold
        else:
            del view
            obj.close()

    def _seal_acc(self, t: _Task, kind: int, weight: float, count: int) -> bytes:
        wire.write_object_header(
            t.acc_obj.buf,
            kind=kind,
            spec_hash=t.spec_hash or bytes(16),
            data_nbytes=t.acc_obj.nbytes - wire.HEADER_SIZE,
            weight=weight,
            count=count,
            round=t.round,
        )
        key = t.acc_obj.key_bytes
        assert self.store is not None
        self.store.seal(key)
        return key

    def _checkpoint(self, ep: bpf.Endpoint, t: _Task, *, child: int) -> None:
        key = self._seal_acc(t, wire.KIND_PARTIAL, t.acc.weight, t.acc.count)
        t.sealed = True
        ep.send(
            Frame(
                dst=t.gateway_ep,
                src=0,
                kind=Kind.CHECKPOINT,
                job=self.job_id,
                key=key,
                weight=t.acc.weight,
                round=t.round,
                count=t.acc.count,
                parent=child,
                seq=t.slot,
            )
        )

    def _finish(self, ep: bpf.Endpoint, t: _Task) -> None:
        acc = t.acc.fold() if t.lazy and not t.masked else t.acc
        top = t.role == Role.TOP
        if top:
            acc.finalize()  # FedAvg divides; a masked sum stays the sum
        weight, count = acc.weight, acc.count
        del acc
        key = self._seal_acc(t, wire.KIND_GLOBAL if top else wire.KIND_PARTIAL, weight, count)
        self._drop_task()
        common = dict(
            job=self.job_id, key=key, weight=weight, round=t.round, count=count, seq=t.slot
        )
        if top:
            ep.send(Frame(dst=t.gateway_ep, src=0, kind=Kind.RESULT, **common))
        else:
            ep.send(
                Frame(dst=t.parent_ep, src=0, kind=Kind.PARTIAL, parent=t.parent_slot, **common)
            )
            ep.send(Frame(dst=t.gateway_ep, src=0, kind=Kind.ACK, **common))
        self.tasks_done += 1
        log.debug(
            "endpoint %d: slot %d of round %d done (%d updates, %.1f ms)",
            ep.id,
            t.slot,
            t.round,
            count,
            (time.perf_counter() - t.t0) * 1e3,
        )

    def _drop_task(self) -> None:
        t, self._task = self._task, None
        if t is None:
            return
        t.acc = None
        for o in t.held:
            o.close()
        t.held.clear()
        t.acc_obj.close()


def start_workers(socket_path: str, n: int) -> list[EndpointWorker]:
    """Start ``n`` job-agnostic endpoints and wait until each has registered (or failed to),
    with the fold kernel loaded first."""
    fedavg.preload()
    # each endpoint is one thread of work: BLAS (the Gram pass of a sharded round) must not
    # start a thread per core under every endpoint
    threadpool_limits(1, user_api="blas")
    workers = [EndpointWorker(socket_path, name=f"aggregator-{i}") for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.ready.wait(10)
    return workers
