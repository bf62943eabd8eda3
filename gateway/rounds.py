"""One round of one job on one node: slots, endpoints, deliveries, acks and re-delivery.

All methods run on the gateway's event-loop thread; I/O happens through the callables given
at construction (``send`` a frame, ``forward`` a partial to another node, ``publish`` the
result), so the logic is testable with fakes.

Protocol (frames carry the slot id in ``seq``):

- ``TASK`` (gateway -> endpoint): role and lazy flag in ``flags``, accumulator object in
  ``key``, goal in ``count``, parent endpoint in ``parent`` (the gateway's own endpoint when
  the parent has none yet or lives on another node), parent *slot* id in ``weight`` (0 for
  the top) so the child can stamp it into its PARTIAL's ``parent``.
- ``UPDATE`` (gateway -> intake slot): a sealed update and its sample count.
- ``PARTIAL`` (child -> parent endpoint, or gateway -> parent on re-delivery): a sealed
  partial sum, its weight sum and update count; ``seq`` = child slot id, so a parent folds
  each child at most once.
- ``ACK`` (child -> gateway, after sealing its partial and sending it to its parent): the
  gateway frees the child's inputs and forwards the partial if the parent changed meanwhile.
- ``RESULT`` (top -> gateway): the sealed global model.
- ``FAILED`` (endpoint -> gateway): a frame's work was not done, for want of the object it
  names (``key``; why in ``count``, :class:`bpf.Failure`: not in the store, unreadable, another
  model). Logged at ERROR with the key, counted (``endpoint_failures``, the latest in
  ``last_failure``, both in :meth:`RoundEngine.progress`, hence the job's status; and the
  ``failed`` callback: the gateway's ``fedfaas_gateway_aggregator_failures_total``). The
  endpoint says nothing more for that work, so the slot (a shard: ``gateway/sharded.py``) runs
  again once silent for the stall limit, as after any endpoint error, and fails that way again,
  visibly, while the object stays unusable. A lazy round re-runs no slot for silence alone (a
  lazy slot is silent until its last input), but a slot that failed so is re-run the same way.
- ``CHECKPOINT`` (middle or top -> gateway, eager): after folding a child's partial the slot
  sealed its accumulator (``key``, ``weight``, ``count`` so far; child slot in ``parent``) and
  writes nothing until the gateway answers. Once the checkpoint is journaled, the gateway
  frees the partials it covers and the checkpoint before it.
- ``SPARE`` (gateway -> that endpoint): the answer when more partials wait for the slot, a
  fresh object for its next accumulator. When none waits, the slot is *parked* instead: it
  gives its endpoint back (a leaf may take it) and runs again, from its checkpoint (delivered
  as a PARTIAL whose ``seq`` is the slot's own id) plus the partials it does not cover, once
  another child finishes. So a middle or top never holds an endpoint while it waits, its
  children report to the gateway (never directly), and any free endpoint may run it.

Retention: an update is freed once its leaf's partial is journaled, a child's partial once a
journaled checkpoint or partial of its parent covers it, so a node holds in-flight uploads plus
a few objects per running slot, however many leaves a middle or the top has.

Which endpoint runs which slot, the frames that start it and feed it, and re-runs
(a disconnect, a stall, a store that refuses an accumulator): :mod:`gateway.slots`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from bpf import Failure, Frame, Kind
from core.objstore import key_hex
from gateway.plan import Plan
from gateway.replan import PlanConflict
from gateway.slots import Input, SlotDispatch, SlotState

log = logging.getLogger(__name__)


class RoundEngine(SlotDispatch):
    """State machine of one round on one node (see the module docstring)."""

    # -- intake --------------------------------------------------------------------------------
    @property
    def accepted(self) -> int:
        return len(self.clients)

    def full(self) -> bool:
        return self.frozen or self.accepted >= self.capacity

    def pending(self) -> int:
        """Client updates held by local slots that have not finished (the node's queue)."""
        return sum(len(s.updates) for s in self.slots.values() if s.local and s.done is None)

    # -- re-planning ---------------------------------------------------------------------------
    def check_plan(self, plan: Plan) -> None:
        """Raise :class:`~gateway.replan.PlanConflict` when ``plan`` would lose or move work.

        Rules (as ``control_plane.planning.diff_plans`` / ``replan``): a slot holding updates,
        partials or a finished partial stays, on its node, under the same parent; a finished
        slot keeps its goal; a local intake slot's goal is at least what it already holds.
        """
        new = plan.by_id()
        for sid, st in self.slots.items():
            busy = bool(st.assigned or st.partials or st.done is not None)
            ns = new.get(sid)
            if ns is None:
                if busy:
                    raise PlanConflict(f"slot {sid} holds updates; the plan must keep it")
                continue
            if busy and (ns.node != st.slot.node or ns.parent != st.slot.parent):
                raise PlanConflict(f"slot {sid} holds updates; it cannot move node or parent")
            if st.done is not None and ns.goal != st.slot.goal:
                raise PlanConflict(f"slot {sid} already finished with goal {st.slot.goal}")
            if st.local and not plan.children(sid) and ns.goal < st.assigned:
                raise PlanConflict(
                    f"slot {sid} already holds {st.assigned} updates; goal {ns.goal} is too low"
                )
        if self.result is not None:
            raise PlanConflict(f"round {self.round} already has its result")

    def apply_plan(self, plan: Plan, version: int | None = None) -> list[int]:
        """Switch to ``plan`` in place (call :meth:`check_plan` first); returns restarted slots.

        Slots are matched by id. A running local slot whose goal, parent or children changed
        is given a fresh TASK on the same endpoint and all its inputs again (the aggregator
        drops the old task); slots that disappear hold nothing and only free their endpoint.
        """
        self.check_plan(plan)
        old = self.slots
        parent_node = {
            sid: old[st.slot.parent].slot.node
            for sid, st in old.items()
            if st.slot.parent is not None and st.slot.parent in old
        }
        slots: dict[int, SlotState] = {}
        restart: list[SlotState] = []
        for s in plan.slots:
            st = old.get(s.id)
            if st is None or st.slot.node != s.node:
                slots[s.id] = SlotState(s, s.node == self.node)
                continue
            if st.slot != s and st.local and st.endpoint is not None and st.done is None:
                restart.append(st)
            st.slot = s
            slots[s.id] = st
        for sid, st in old.items():
            if sid not in slots and st.acc is not None:
                self.retired.append(st.acc)
                st.acc = None
        self.slots, self.plan, self.plan_version = slots, plan, version
        self.intake = [self.slots[s.id] for s in plan.intake(self.node)]
        self.capacity = sum(s.slot.goal for s in self.intake)
        for st in restart:
            for child in self.slots.values():  # a direct send to the old task may be dropped:
                if child.slot.parent == st.slot.id:  # have its ACK re-deliver the partial
                    child.parent_ep_at_task = None
            assert st.endpoint is not None
            self._start(st, st.endpoint)
        for sid, st in self.slots.items():
            # a finished partial whose parent moved to another node (the root's node died
            # and another took the job over) goes to the parent where it runs now; the
            # parent folds each child once, so a partial that also reached the old one
            # counts once
            if st.done is None or st.slot.parent is None or self.result is not None:
                continue
            parent = self.slots[st.slot.parent]
            if parent_node.get(sid) != parent.slot.node and (st.local or parent.local):
                self._to_parent(st, sent_directly=False)
        log.info(
            "round %d: plan v%s applied (goal %d, %d slots here, %d restarted)",
            self.round,
            version,
            plan.goal,
            sum(1 for s in self.slots.values() if s.local),
            len(restart),
        )
        return [st.slot.id for st in restart]

    def add_update(self, client: str, key: bytes, weight: float) -> int:
        """Record a sealed, journaled update (the gateway holds one lease); returns its slot id."""
        want = self.plan.assignment.get(client)
        cands = [s for s in self.intake if s.assigned < s.slot.goal and s.done is None]
        if not cands:
            raise RuntimeError("round is full on this node")
        st = next((s for s in cands if s.slot.id == want), cands[0])
        inp = Input(key, float(weight), 1, client=client)
        st.updates.append(inp)
        st.assigned += 1
        self.clients[client] = key
        if st.endpoint is not None:
            self._deliver_update(st, inp)
        return st.slot.id

    def add_remote_partial(self, child_id: int, key: bytes, weight: float, count: int) -> None:
        """A child slot on another node finished; its partial now lives in this node's store."""
        child = self.slots.get(child_id)
        if child is None or child.local:
            raise ValueError(f"slot {child_id} is not a remote child in this plan")
        if child.done is not None:
            self.store.release(key)  # duplicate forward: keep the first
            return
        child.done = Input(key, weight, count, child=child_id)
        self._persist(child_id, child.done, lambda: None)
        self._to_parent(child, sent_directly=False)

    def restore_checkpoint(
        self,
        slot_id: int,
        key: bytes,
        weight: float,
        count: int,
        clients: list[str],
        children: list[int],
    ) -> None:
        """Recovery: an unfinished slot's journaled checkpoint (call before :meth:`restore_done`
        of its children, whose partials it covers and which may be freed already)."""
        st = self.slots[slot_id]
        st.ckpt = Input(key, weight, count, child=slot_id, clients=tuple(clients))
        st.covered = frozenset(children)
        st.pinned = [key]
        for c in clients:
            self.clients[c] = key

    def superseded(self, slot_id: int, done: Collection[int]) -> bool:
        """Recovery: whether this slot's partial is covered by its parent's restored
        checkpoint or by its parent's journaled partial (slot ids in ``done``): then it was
        freed, or may be, and is never read again."""
        parent = self.slots[slot_id].slot.parent
        if parent is None or parent not in self.slots:
            return False
        return parent in done or slot_id in self.slots[parent].covered

    def restore_done(
        self,
        slot_id: int,
        key: bytes,
        weight: float,
        count: int,
        clients: list[str],
        *,
        superseded: bool = False,
    ) -> None:
        """Recovery: a slot finished before a gateway restart (its partial was journaled).
        A ``superseded`` one (see :meth:`superseded`) holds no object of this gateway's."""
        st = self.slots[slot_id]
        st.done = Input(key, weight, count, child=slot_id, clients=tuple(clients))
        if superseded:
            self.released.add(key)
        if not self.plan.children(slot_id):
            st.assigned = st.slot.goal
        for c in clients:
            self.clients[c] = key
        if st.slot.parent is None:
            return
        if not superseded:
            self._to_parent(st, sent_directly=False)
        elif self.slots[st.slot.parent].local:  # its clients count in the parent's records
            self.slots[st.slot.parent].partials[slot_id] = st.done

    # -- frames from endpoints -----------------------------------------------------------------
    def on_frame(self, f: Frame) -> None:
        if f.round != self.round:
            log.debug("round %d: ignoring %s for round %d", self.round, f.kind.name, f.round)
            return
        if f.kind == Kind.FAILED:
            self._on_failed(f)
            return
        st = self.slots.get(f.seq)
        if f.kind == Kind.PARTIAL:
            return  # a child's direct send to us (parent had no endpoint); its ACK carries the same
        if st is None or not st.local or st.endpoint != f.src or st.acc != f.key:
            log.warning(
                "round %d: stale %s from endpoint %d for slot %d",
                self.round,
                f.kind.name,
                f.src,
                f.seq,
            )
            return
        st.heard_ns = time.monotonic_ns()
        if f.kind == Kind.ACK:
            self._on_ack(st, f)
        elif f.kind == Kind.RESULT:
            self._on_result(st, f)
        elif f.kind == Kind.CHECKPOINT:
            self._on_checkpoint(st, f)

    #: what a FAILED frame's ``seq`` names
    work_unit = "slot"

    def _on_failed(self, f: Frame) -> None:
        """An endpoint could not use an object a frame named (see the module docstring): the
        work waits for the stall limit's re-run; said and counted here."""
        try:
            why, kind = Failure(f.count).describe(), Kind(f.flags).name
        except ValueError:
            why, kind = f"failed (reason {f.count})", f"kind-{f.flags}"
        self.endpoint_failures += 1
        self._failed()
        st = self.slots.get(f.seq) if self.work_unit == "slot" else None
        if st is not None and st.local and st.endpoint == f.src and st.done is None:
            st.failed = True  # re-run once silent for the stall limit, lazy or not
        self.last_failure = (
            f"endpoint {f.src}, {self.work_unit} {f.seq}, {kind} frame: object "
            f"{key_hex(f.key)} {why}"
        )
        log.error(
            "round %d: %s not done: %s; run again once silent for the stall limit",
            self.round,
            f"{self.work_unit} {f.seq}",
            self.last_failure,
        )

    def _on_checkpoint(self, st: SlotState, f: Frame) -> None:
        if st.done is not None or f.parent not in st.partials or f.parent in st.covered:
            log.error(
                "round %d: slot %d sent a checkpoint after child %d it cannot have",
                self.round,
                st.slot.id,
                f.parent,
            )
            return
        expected = (st.ckpt.count if st.ckpt is not None else 0) + st.partials[f.parent].count
        if f.count != expected:
            self._rerun(
                st, f"checkpointed {f.count} updates after child {f.parent}, not {expected}"
            )
            return
        covered = st.covered | {f.parent}
        ck = Input(
            f.key,
            f.weight,
            f.count,
            child=st.slot.id,
            clients=tuple(c for k in sorted(covered) for c in st.partials[k].clients),
        )
        st.ckpt, st.covered = ck, covered
        st.pinned.append(f.key)
        if not (self.has_work(st) and self._send_spare(st)):
            # park (no spare when the store refused one: a pump runs it again from here):
            # the endpoint writes nothing more for this slot and is free again
            st.acc, st.endpoint = None, None
        self._checkpoint(
            st.slot.id, ck, sorted(covered), lambda: self._release_covered(st, ck.key, covered)
        )

    def _release_covered(self, st: SlotState, key: bytes, covered: frozenset[int]) -> None:
        """A checkpoint is journaled: free the partials it covers and older checkpoints."""
        if self.closed or key not in st.pinned:
            return  # the round ended, or the slot finished and freed everything
        i = st.pinned.index(key)
        for old in st.pinned[:i]:
            self._free(old)
        del st.pinned[:i]
        for c in covered:
            self._free(st.partials[c].key)

    def _free(self, key: bytes) -> None:
        """Release the round's lease of ``key`` now, once (``close`` skips it)."""
        if key not in self.released:
            self.released.add(key)
            self.store.release(key)

    def _on_ack(self, st: SlotState, f: Frame) -> None:
        if st.done is not None or st.slot.parent is None:
            return
        if f.count != st.slot.goal:
            self._rerun(st, f"acked {f.count} updates, goal {st.slot.goal}")
            return
        covered = [i.client for i in st.updates if i.client is not None]
        for p in st.partials.values():
            covered.extend(p.clients)
        st.done = Input(f.key, f.weight, f.count, child=st.slot.id, clients=tuple(covered))
        self._done_count += 1
        st.done_seq = self._done_count
        # inputs are freed only once the partial that covers them is journaled
        self._persist(st.slot.id, st.done, lambda: self._release_inputs(st))
        self._to_parent(st, sent_directly=True)

    def _to_parent(self, st: SlotState, *, sent_directly: bool) -> None:
        assert st.done is not None and st.slot.parent is not None
        parent = self.slots[st.slot.parent]
        if not parent.local:
            if self._forward is None:
                raise RuntimeError(
                    f"slot {st.slot.id}: parent on node {parent.slot.node} but no forwarder"
                )
            self._forward(st.slot, st.done)
            return
        parent.partials[st.slot.id] = st.done
        if st.slot.id in parent.covered:
            return  # recovery: the parent's checkpoint holds it already
        if parent.endpoint is not None and (
            not sent_directly or parent.endpoint != st.parent_ep_at_task
        ):
            self._deliver_partial(parent, st.done)

    def _on_result(self, st: SlotState, f: Frame) -> None:
        if self.result is not None or st.slot.parent is not None:
            return
        if f.count != st.slot.goal:
            self._rerun(st, f"reported {f.count} updates, goal {st.slot.goal}")
            return
        self.result = Input(f.key, f.weight, f.count)
        st.done = self.result
        self._done_count += 1
        st.done_seq = self._done_count
        # a lone top's updates, like every input, stay until the round closes: the result is
        # in no journal until it is published, and a restart before that runs the round again
        self._publish(self.result)

    def _release_inputs(self, st: SlotState) -> None:
        """The slot's partial is journaled: free all it was made from."""
        if self.closed:
            return  # close() released everything already
        self._release_updates(st)
        for key in [p.key for p in st.partials.values()] + st.pinned:
            self._free(key)
        st.pinned = []

    def _release_updates(self, st: SlotState) -> None:
        for inp in st.updates:
            self.store.release(inp.key)
        st.updates = []

    # -- end -----------------------------------------------------------------------------------
    def unfinished(self) -> dict[int, tuple[str, ...]]:
        """Local slots that have not finished, with the clients whose updates they hold (in
        updates, in children's partials, in a checkpoint): at the round's end on a node that
        does not publish it, these updates are in no partial sent on, so in no model."""
        out: dict[int, tuple[str, ...]] = {}
        for sid, st in self.slots.items():
            if not st.local or st.done is not None:
                continue
            clients = {i.client for i in st.updates if i.client is not None}
            for p in st.partials.values():
                clients.update(p.clients)
            if st.ckpt is not None:
                clients.update(st.ckpt.clients)
            if clients:
                out[sid] = tuple(sorted(clients))
        return out

    def close(self, keep: bytes | None = None) -> None:
        """Free every object of the round this node still holds, except ``keep``."""
        self.closed = True
        keys: set[bytes] = set()
        for st in self.slots.values():
            keys.update(i.key for i in st.updates)
            keys.update(i.key for i in st.partials.values())
            keys.update(st.abandoned)
            keys.update(st.pinned)
            keys.update(self.retired)
            if st.acc is not None:
                keys.add(st.acc)
            if st.done is not None and not st.local:
                keys.add(st.done.key)  # remote partials received into our store
            st.updates, st.abandoned = [], []
        keys.discard(keep or b"")
        keys -= self.released
        for k in keys:
            if self.store.leases(k):
                self.store.release(k)  # the round's lease; a checkpoint may still hold another

    def progress(self) -> dict[str, object]:
        return {
            "round": self.round,
            "accepted": self.accepted,
            "capacity": self.capacity,
            "slots": {
                sid: {
                    "role": s.slot.role,
                    "goal": s.slot.goal,
                    "node": s.slot.node,
                    "endpoint": s.endpoint,
                    "updates": s.assigned,
                    "partials": len(s.partials),
                    "checkpoint_covers": len(s.covered),
                    "done": s.done is not None,
                    "attempts": s.attempts,
                }
                for sid, s in self.slots.items()
            },
            "done": self.result is not None,
            "store_refusals": self.store_refusals,
            "endpoint_failures": self.endpoint_failures,
            "last_failure": self.last_failure,
            "frozen": self.frozen,
            "plan_version": self.plan_version,
        }
