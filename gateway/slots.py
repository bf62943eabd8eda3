"""The slots of one round on one node and the endpoints that run them: a slot's TASK and the
inputs delivered to it, endpoints given to waiting slots, re-runs. The round's frames and
bookkeeping are :class:`gateway.rounds.RoundEngine`, built on :class:`SlotDispatch`.

An endpoint that disconnects before acking loses its slot: the slot gets a fresh
accumulator and the next idle endpoint, and every input is delivered again. Accumulators of
abandoned attempts are kept until the round ends (a parent may be reading one).

A fresh accumulator the store refuses (``/dev/shm`` full: ``OSError``, or
:class:`~core.objstore.StoreFull`) changes nothing about the slot: it keeps waiting without
an endpoint (a parking middle parks), the refusal is logged and counted (``refused``), and a
pump (the gateway's housekeeping pumps every few milliseconds) asks the store again after
:data:`STORE_RETRY_S`. No slot is left on an endpoint without a TASK, and a refused attempt
holds no object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bpf import FLAG_LAZY, FLAG_MASKED, Frame, Kind
from core.objstore import Namespace, StoreFull
from gateway.plan import Plan, Slot

log = logging.getLogger(__name__)

#: seconds a slot whose accumulator the store refused waits before the store is asked again
STORE_RETRY_S = 0.2


@dataclass
class Input:
    """Something a slot folds: a client update or a child's partial."""

    key: bytes
    weight: float
    count: int
    child: int = 0  # child slot id for partials
    client: str | None = None
    clients: tuple[str, ...] = ()  # clients a partial covers (local ones)


class StoreWait(Protocol):
    """Whoever waits for a store object the store refused (a slot, a sharded aggregation)."""

    refusals: int  # refused in a row (logged on the first)
    retry_ns: int  # the store is not asked again for it before this time (monotonic)


@dataclass
class SlotState:
    slot: Slot
    local: bool
    endpoint: int | None = None
    parent_ep_at_task: int | None = None
    acc: bytes | None = None
    updates: list[Input] = field(default_factory=list)
    partials: dict[int, Input] = field(default_factory=dict)
    done: Input | None = None
    abandoned: list[bytes] = field(default_factory=list)
    attempts: int = 0
    assigned: int = 0  # client updates routed here (never decreases)
    done_seq: int | None = None  # completion order within the round (reuse: first done first)
    ckpt: Input | None = None  # the latest checkpoint (child = own id): a re-run starts here
    covered: frozenset[int] = frozenset()  # children folded into ``ckpt``
    pinned: list[bytes] = field(default_factory=list)  # checkpoints not freed yet, oldest first
    heard_ns: int = 0  # last TASK to, or valid frame from, its endpoint (monotonic)
    refusals: int = 0  # accumulators the store refused it in a row (logged on the first)
    retry_ns: int = 0  # no store allocation tried for it before this time (monotonic)
    failed: bool = False  # its endpoint answered FAILED since its last start: it runs again


class SlotDispatch:
    """One round's slots on one node, and the endpoints that run them (see the module
    docstring); :class:`gateway.rounds.RoundEngine` adds the frames and the bookkeeping."""

    def __init__(
        self,
        *,
        job_id: int,
        node: str,
        round: int,
        plan: Plan,
        store: Namespace,
        gateway_ep: int,
        send: Callable[[Frame], None],
        publish: Callable[[Input], None],
        forward: Callable[[Slot, Input], None] | None = None,
        persist: Callable[[int, Input, Callable[[], None]], None] | None = None,
        checkpoint: Callable[[int, Input, list[int], Callable[[], None]], None] | None = None,
        lazy: bool = False,
        masked: bool = False,
        refused: Callable[[BaseException], None] | None = None,
        failed: Callable[[], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.node = node
        self.round = round
        self.plan = plan
        self.store = store
        self.gateway_ep = gateway_ep
        self._send = send
        self._publish = publish
        self._forward = forward
        self._persist = persist or (lambda _sid, _inp, release: release())
        self._checkpoint = checkpoint or (lambda _sid, _inp, _kids, release: release())
        self._refused = refused or (lambda _exc: None)
        self._failed = failed or (lambda: None)
        #: accumulators the store refused this round (each slot waited and was tried again)
        self.store_refusals = 0
        #: FAILED frames this round (an endpoint could not use an object), and the latest
        self.endpoint_failures = 0
        self.last_failure = ""
        self.closed = False
        self.lazy = lazy
        #: secure aggregation: TASKs say so (FLAG_MASKED), the endpoints fold in Z_2^32
        self.masked = masked
        self.slots = {s.id: SlotState(s, s.node == node) for s in plan.slots}
        self.intake = [self.slots[s.id] for s in plan.intake(node)]
        self.capacity = sum(s.slot.goal for s in self.intake)
        self.result: Input | None = None
        self.clients: dict[str, bytes] = {}
        self.frozen = False  # intake closed (``close``): the round aggregates what it holds
        self.plan_version: int | None = None
        self.retired: list[bytes] = []  # accumulators of slots a re-plan restarted or removed
        self.released: set[bytes] = set()  # objects freed before the round's end
        #: (slot id, root node) of partials that root has (:mod:`gateway.forward`): one the
        #: old root had goes again to a root that took the job over
        self.delivered: set[tuple[int, str]] = set()
        #: slots whose partial's forward is over undelivered: counted as dropped, once
        #: (:func:`gateway.forward.drop`), or its job deleted
        self.dropped: set[int] = set()
        self._done_count = 0

    # -- endpoints -----------------------------------------------------------------------------
    def busy_endpoints(self) -> set[int]:
        return {
            s.endpoint for s in self.slots.values() if s.endpoint is not None and s.done is None
        }

    def needs_endpoint(self) -> list[SlotState]:
        """Local unfinished slots without an endpoint that have work waiting: parking middles
        and tops first (a partial they fold is freed once the checkpoint is journaled, so
        partials never pile up behind busy leaves), then by role and id."""
        out = []
        for s in self.slots.values():
            if (
                not s.local
                or s.done is not None
                or s.endpoint is not None
                or self.result is not None
            ):
                continue
            if self.has_work(s):
                out.append(s)
        return sorted(out, key=lambda s: (not self.parks(s), s.slot.role, s.slot.id))

    def pump(self, idle: list[int]) -> None:
        """Give idle endpoints to slots with waiting work, in order (see :meth:`assign`)."""
        for st in self.needs_endpoint():
            if not idle:
                return
            if not self._start(st, idle[0]):
                return  # the store is full: the next pump asks again
            idle.pop(0)

    def assign(self, slot_id: int, ep: int) -> bool:
        """Run local slot ``slot_id`` on endpoint ``ep`` (granted this job): sends the TASK
        and (re)delivers every input the slot holds. False when the store refused the slot's
        accumulator: nothing changed, the slot still waits for an endpoint."""
        st = self.slots[slot_id]
        if not st.local or st.done is not None or st.endpoint is not None:
            raise ValueError(f"slot {slot_id} does not need an endpoint")
        return self._start(st, ep)

    def _new_object(self, st: SlotState, what: str) -> bytes | None:
        """A fresh writable object for slot ``st`` (an accumulator), or None when the store
        refuses it now: see :meth:`_allocate`."""
        return self._allocate(st, f"slot {st.slot.id}", what)

    def _allocate(
        self, wait: StoreWait, who: str, what: str, nbytes: int | None = None
    ) -> bytes | None:
        """A fresh writable object (closed: its key) for ``who``'s ``what``, or None when the
        store refuses it now (its memory file system full, or its object cap reached): logged
        on the first refusal in a row, counted, reported to ``refused``, and not asked again
        for ``who`` before :data:`STORE_RETRY_S`. ``nbytes``: a plain file of that size
        (:meth:`~core.objstore.Namespace.allocate`)."""
        now = time.monotonic_ns()
        if now < wait.retry_ns:  # refused a moment ago: no page churn on a full file system
            return None
        try:
            obj = self.store.allocate() if nbytes is None else self.store.allocate(nbytes)
        except (StoreFull, OSError) as exc:
            wait.retry_ns = now + int(STORE_RETRY_S * 1e9)
            self.store_refusals += 1
            wait.refusals += 1
            if wait.refusals == 1:
                log.warning(
                    "round %d: %s waits: the store refused its %s (%s); asked again at "
                    "the next pump",
                    self.round,
                    who,
                    what,
                    exc,
                )
            self._refused(exc)
            return None
        obj.close()
        if wait.refusals:
            log.info(
                "round %d: %s got its %s after %d refusal(s)", self.round, who, what, wait.refusals
            )
            wait.refusals = 0
        return obj.key_bytes

    def _start(self, st: SlotState, ep: int) -> bool:
        acc = self._new_object(st, "accumulator")
        if acc is None:
            return False
        if st.acc is not None:
            st.abandoned.append(st.acc)
        st.acc = acc
        st.endpoint = ep
        st.attempts += 1
        st.failed = False
        st.heard_ns = time.monotonic_ns()
        parent = self.slots.get(st.slot.parent) if st.slot.parent is not None else None
        if (
            parent is not None
            and parent.local
            and parent.endpoint is not None
            and parent.done is None
            and not self.parks(parent)
        ):
            st.parent_ep_at_task = parent.endpoint
        else:
            st.parent_ep_at_task = self.gateway_ep
        flags = st.slot.role | (FLAG_LAZY if self.lazy else 0) | (FLAG_MASKED if self.masked else 0)
        log.debug(
            "round %d: slot %d -> endpoint %d (attempt %d)", self.round, st.slot.id, ep, st.attempts
        )
        self._send(
            Frame(
                dst=ep,
                src=self.gateway_ep,
                kind=Kind.TASK,
                flags=flags,
                job=self.job_id,
                key=st.acc,
                weight=float(st.slot.parent or 0),
                round=self.round,
                count=st.slot.goal,
                parent=st.parent_ep_at_task,
                seq=st.slot.id,
            )
        )
        for inp in st.updates:
            self._deliver_update(st, inp)
        if st.ckpt is not None:
            self._deliver_partial(st, st.ckpt)
        for inp in st.partials.values():
            if inp.child not in st.covered:
                self._deliver_partial(st, inp)
        return True

    def parks(self, st: SlotState) -> bool:
        """Eager slots with children checkpoint after each child's partial and park when no
        other waits (see the module): they never hold an endpoint while they wait."""
        return not self.lazy and bool(self.plan.children(st.slot.id))

    def has_work(self, st: SlotState) -> bool:
        """Inputs the slot has not folded yet (or a checkpoint that already meets a lowered
        goal), so it needs an endpoint."""
        if st.updates or any(c not in st.covered for c in st.partials):
            return True
        return st.ckpt is not None and st.ckpt.count >= st.slot.goal

    def _send_spare(self, st: SlotState) -> bool:
        """Send the endpoint its next accumulator; False when the store refused one."""
        acc = self._new_object(st, "spare accumulator")
        if acc is None:
            return False
        st.acc = acc  # the endpoint's next accumulator
        self._send_to(st, Kind.SPARE, acc)
        return True

    def _deliver_update(self, st: SlotState, inp: Input) -> None:
        self._send_to(st, Kind.UPDATE, inp.key, weight=inp.weight, count=1)

    def _deliver_partial(self, st: SlotState, inp: Input) -> None:
        self._send_to(
            st,
            Kind.PARTIAL,
            inp.key,
            weight=inp.weight,
            count=inp.count,
            parent=st.slot.id,
            seq=inp.child,
        )

    def _send_to(self, st: SlotState, kind: Kind, key: bytes, **fields: Any) -> None:
        """A frame of this round to the slot's endpoint (``seq`` = the slot unless given)."""
        assert st.endpoint is not None
        fields.setdefault("seq", st.slot.id)
        self._send(
            Frame(
                dst=st.endpoint,
                src=self.gateway_ep,
                kind=kind,
                job=self.job_id,
                key=key,
                round=self.round,
                **fields,
            )
        )

    def rerun_stalled(self, stall_s: float, now_ns: int | None = None) -> list[int]:
        """Run again, on the same endpoint, every eager slot that holds all it needs to go on
        and has not been heard of for ``stall_s`` seconds: a frame lost between the gateway
        and an endpoint (seen, rarely, with the eBPF router) costs that, not the round. In a
        lazy round only a slot whose endpoint answered FAILED: a lazy slot says nothing until
        its last input, so its silence alone proves nothing, but after a FAILED frame its
        endpoint will never finish it."""
        if stall_s <= 0 or self.result is not None:
            return []
        now = time.monotonic_ns() if now_ns is None else now_ns
        out = []
        for st in self.slots.values():
            if not st.local or st.endpoint is None or st.done is not None:
                continue
            if self.lazy and not st.failed:
                continue
            ready = bool(self.plan.children(st.slot.id)) or st.assigned >= st.slot.goal
            if ready and self.has_work(st) and now - st.heard_ns > stall_s * 1e9:
                self._rerun(st, f"silent for {(now - st.heard_ns) / 1e9:.1f} s")
                out.append(st.slot.id)
        return out

    def _rerun(self, st: SlotState, why: str) -> None:
        """The endpoint missed a frame (its count or its silence says so): run the slot
        again there from what the gateway holds; the attempt's accumulator is abandoned."""
        assert st.endpoint is not None
        log.warning(
            "round %d: slot %d on endpoint %d %s; running it again",
            self.round,
            st.slot.id,
            st.endpoint,
            why,
        )
        ep = st.endpoint
        st.endpoint = None  # its acc is abandoned at the next start: the endpoint may write it
        if not self._start(st, ep):
            log.warning(
                "round %d: slot %d leaves endpoint %d until the store has room",
                self.round,
                st.slot.id,
                ep,
            )

    def on_disconnect(self, ep: int) -> list[int]:
        """An endpoint is gone: its unfinished slots lose it. Returns the affected slot ids."""
        lost = []
        for st in self.slots.values():
            if st.endpoint == ep and st.done is None and self.result is None:
                st.endpoint = None
                lost.append(st.slot.id)
        if lost:
            log.warning("round %d: endpoint %d gone, slots %s will be re-run", self.round, ep, lost)
        return lost
