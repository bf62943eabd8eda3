"""Pure logic: the static plan, and the round engine's routing, acks and re-delivery (fakes)."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from typing import Any

import pytest

from bpf import Failure, Frame, Kind
from gateway.plan import LEAF, MIDDLE, TOP, Plan, Slot, static_plan
from gateway.rounds import RoundEngine
from gateway.slots import Input


def test_static_plan_has_ceil_goal_over_fanout_leaves_under_one_top() -> None:
    p = static_plan(20, [f"c{i}" for i in range(20)], ["n"], fanout=2)
    leaves = [s for s in p.slots if s.role == LEAF]
    assert p.top.role == TOP and p.top.goal == 20 and len(leaves) == 10
    assert all(s.goal == 2 and s.parent == p.top.id for s in leaves)
    assert static_plan(5, ["a", "b", "c", "d", "e"], ["n"], fanout=2).intake("n")[-1].goal == 1


def test_small_goal_on_one_node_is_a_lone_top() -> None:
    p = static_plan(2, ["a", "b"], ["n"], fanout=2)
    assert len(p.slots) == 1 and p.intake("n") == [p.top]


def test_other_nodes_get_a_middle_so_one_partial_crosses_nodes() -> None:
    p = static_plan(7, [f"c{i}" for i in range(7)], ["a", "b"], fanout=2)
    mids = [s for s in p.slots if s.role == MIDDLE]
    assert len(mids) == 1 and mids[0].node == "b" and mids[0].parent == p.top.id
    assert p.node_goal("a") + p.node_goal("b") == 7
    assert all(s.node == "b" for s in p.slots if s.parent == mids[0].id)
    assert set(p.client_nodes.values()) == {"a", "b"}


def test_plans_are_validated() -> None:
    with pytest.raises(ValueError):
        Plan((Slot(1, "n", LEAF, 2, None),))  # no top
    with pytest.raises(ValueError):
        Plan((Slot(1, "n", TOP, 3, None), Slot(2, "n", LEAF, 2, 1)))  # goals do not add up


class FakeStore:
    """The slice of Namespace the engine uses; ``held`` maps keys to lease counts."""

    def __init__(self) -> None:
        self.held: dict[bytes, int] = {}
        self.n = 0
        self.full = False  # allocate raises as Namespace does on a full /dev/shm

    def allocate(self):  # type: ignore[no-untyped-def]
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.n += 1
        key = self.n.to_bytes(16, "big")
        self.held[key] = 1

        class Obj:
            key_bytes = key

            def close(self) -> None:
                pass

        return Obj()

    def release(self, key: bytes) -> bool:
        self.held[key] -= 1
        if self.held[key] == 0:
            del self.held[key]
            return True
        return False

    def free(self, key: bytes) -> None:
        self.held.pop(key, None)

    def leases(self, key: bytes) -> int:
        return self.held.get(key, 0)


def engine(
    goal: int = 4, fanout: int = 2, **more: Any
) -> tuple[RoundEngine, list[Frame], list[Input], FakeStore]:
    sent: list[Frame] = []
    published: list[Input] = []
    store = FakeStore()
    plan = static_plan(goal, [f"c{i}" for i in range(goal)], ["n"], fanout)
    eng = RoundEngine(
        job_id=7,
        node="n",
        round=1,
        plan=plan,
        store=store,
        gateway_ep=100,  # type: ignore[arg-type]
        send=sent.append,
        publish=published.append,
        **more,
    )
    return eng, sent, published, store


def update_key(i: int) -> bytes:
    return bytes([0xAA, i]) + bytes(14)


def add_updates(eng: RoundEngine, store: FakeStore, clients: Iterable[int]) -> None:
    """Client ``i``'s update (weight 1) held in ``store`` and added to the round, for each
    ``i`` of ``clients``."""
    for i in clients:
        store.held[update_key(i)] = 1
        eng.add_update(f"c{i}", update_key(i), 1)


def test_updates_wait_for_an_endpoint_then_task_and_updates_are_sent_in_order() -> None:
    eng, sent, _, store = engine()
    for i in range(2):
        store.held[update_key(i)] = 1
        eng.add_update(f"c{i}", update_key(i), 10 + i)
    assert sent == []  # no endpoint yet: updates queue in the gateway
    eng.pump([5])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE, Kind.UPDATE]
    task = sent[0]
    assert (
        task.dst == 5
        and task.seq == 2
        and task.count == 2
        and task.parent == 100
        and int(task.weight) == 1
    )


def test_ack_frees_inputs_and_forwards_partial_to_a_parent_that_arrived_later() -> None:
    eng, sent, published, store = engine()
    add_updates(eng, store, range(2))
    eng.pump([5])
    acc = sent[0].key
    eng.on_frame(
        Frame(dst=100, src=5, kind=Kind.ACK, job=7, key=acc, weight=2, round=1, count=2, seq=2)
    )
    assert update_key(0) not in store.held and update_key(1) not in store.held  # freed once covered
    sent.clear()
    eng.pump([6])  # the top gets an endpoint now: TASK, then the leaf's partial re-delivered
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL]
    assert sent[1].key == acc and sent[1].seq == 2 and sent[1].parent == 1 and sent[1].dst == 6


def test_disconnected_leaf_is_rerun_on_another_endpoint_with_every_input() -> None:
    eng, sent, _, store = engine()
    store.held[update_key(0)] = 1
    eng.add_update("c0", update_key(0), 3)
    eng.pump([5])
    first_acc = sent[0].key
    assert eng.on_disconnect(5) == [2]
    sent.clear()
    eng.pump([9])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE]
    assert sent[0].dst == 9 and sent[0].key != first_acc and sent[1].key == update_key(0)
    assert eng.slots[2].attempts == 2 and first_acc in eng.slots[2].abandoned
    # a late ACK from the dead endpoint's attempt is ignored
    eng.on_frame(
        Frame(
            dst=100, src=5, kind=Kind.ACK, job=7, key=first_acc, weight=3, round=1, count=1, seq=2
        )
    )
    assert eng.slots[2].done is None


def test_result_with_the_goal_publishes_once_and_close_frees_all_but_the_model() -> None:
    eng, sent, published, store = engine(goal=2)  # lone top
    add_updates(eng, store, range(2))
    eng.pump([5])
    acc = sent[0].key
    eng.on_frame(
        Frame(dst=100, src=5, kind=Kind.RESULT, job=7, key=acc, weight=2, round=1, count=2, seq=1)
    )
    eng.on_frame(
        Frame(dst=100, src=5, kind=Kind.RESULT, job=7, key=acc, weight=2, round=1, count=2, seq=1)
    )
    assert len(published) == 1 and published[0].key == acc
    eng.close(keep=acc)
    assert set(store.held) == {acc}


def test_round_full_and_stale_frames() -> None:
    eng, sent, _, store = engine(goal=2)
    add_updates(eng, store, range(2))
    assert eng.full()
    with pytest.raises(RuntimeError):
        eng.add_update("c9", update_key(9), 1)
    eng.on_frame(
        Frame(
            dst=100,
            src=5,
            kind=Kind.RESULT,
            job=7,
            key=bytes(16),
            weight=2,
            round=2,
            count=2,
            seq=1,
        )
    )
    assert eng.result is None


# -- checkpoints: a middle or top frees what it folded ------------------------------------------
def _ack(key: bytes, ep: int, slot: int, count: int = 2) -> Frame:
    return Frame(
        dst=100, src=ep, kind=Kind.ACK, job=7, key=key, weight=count, round=1, count=count, seq=slot
    )


def _checkpoint(key: bytes, ep: int, slot: int, child: int, count: int) -> Frame:
    return Frame(
        dst=100,
        src=ep,
        kind=Kind.CHECKPOINT,
        job=7,
        key=key,
        weight=count,
        round=1,
        count=count,
        parent=child,
        seq=slot,
    )


def _finish_leaf(
    eng: RoundEngine, store: FakeStore, sent: list[Frame], leaf: int, ep: int
) -> bytes:
    """Two updates into ``leaf`` on endpoint ``ep``, then its ACK; returns its partial."""
    add_updates(eng, store, (2 * leaf, 2 * leaf + 1))
    sent.clear()
    eng.assign(leaf, ep)
    acc = sent[0].key
    assert sent[0].kind == Kind.TASK and sent[0].parent == 100  # reports to the gateway, even
    eng.on_frame(_ack(acc, ep, leaf))  # when its parent runs: the parent may park any time
    return acc


def test_checkpoints_free_covered_partials_so_held_objects_do_not_grow_with_leaves() -> None:
    journal: list[tuple[int, Input, list[int]]] = []

    def checkpoint(sid: int, inp: Input, kids: list[int], release) -> None:  # type: ignore[no-untyped-def]
        journal.append((sid, inp, kids))
        release()

    eng, sent, published, store = engine(goal=40)
    eng._checkpoint = checkpoint  # the gateway journals in Redis; here in a list
    held = []
    leaves = [s.id for s in eng.plan.slots if s.role == LEAF]
    for n, leaf in enumerate(leaves):
        partial = _finish_leaf(eng, store, sent, leaf, 5)
        sent.clear()
        eng.pump([6])  # the parked top runs again: its checkpoint, then the new partial
        kinds = [Kind.TASK, Kind.PARTIAL] + ([Kind.PARTIAL] if n else [])
        assert [f.kind for f in sent] == kinds and sent[-1].key == partial
        if n:
            assert sent[1].key == journal[-1][1].key and sent[1].seq == 1  # "own" child
        if leaf == leaves[-1]:
            break
        sent.clear()
        eng.on_frame(_checkpoint(eng.slots[1].acc, 6, 1, leaf, 2 * (n + 1)))  # type: ignore[arg-type]
        assert sent == [] and eng.slots[1].endpoint is None  # nothing waits: parked
        assert partial not in store.held  # covered by a journaled checkpoint: freed
        held.append(len(store.held))
    assert journal[-1][0] == 1 and journal[-1][2] == leaves[:-1] and journal[-1][1].count == 38
    assert set(journal[-1][1].clients) == {f"c{i}" for x in leaves[:-1] for i in (2 * x, 2 * x + 1)}
    # between two leaves the store holds the top's checkpoint only, for all 20 leaves
    assert held == [1] * (len(leaves) - 1)
    top_acc = eng.slots[1].acc
    assert top_acc is not None
    eng.on_frame(
        Frame(
            dst=100,
            src=6,
            kind=Kind.RESULT,
            job=7,
            key=top_acc,
            weight=40,
            round=1,
            count=40,
            seq=1,
        )
    )
    assert published[0].key == top_acc
    eng.close(keep=top_acc)
    assert set(store.held) == {top_acc}


def test_a_checkpoint_with_partials_waiting_gets_a_spare_and_a_rerun_starts_from_it() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, c = (s.id for s in eng.plan.slots if s.role == LEAF)
    pa = _finish_leaf(eng, store, sent, a, 5)
    pb = _finish_leaf(eng, store, sent, b, 5)
    sent.clear()
    eng.assign(1, 6)
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL, Kind.PARTIAL]
    acc = sent[0].key
    sent.clear()
    eng.on_frame(_checkpoint(acc, 6, 1, a, 2))
    assert [f.kind for f in sent] == [Kind.SPARE] and sent[0].dst == 6 and sent[0].seq == 1
    assert eng.slots[1].acc == sent[0].key and eng.slots[1].endpoint == 6  # b still waits
    assert pa not in store.held and pb in store.held
    assert eng.on_disconnect(6) == [1]  # the top dies before folding b
    sent.clear()
    eng.pump([7])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL, Kind.PARTIAL]
    base, rest = sent[1], sent[2]
    assert base.key == acc and base.seq == 1 and base.count == 2  # the checkpoint, as "own" child
    assert rest.key == pb and rest.seq == b
    pc = _finish_leaf(eng, store, sent, c, 5)
    top_acc = eng.slots[1].acc
    assert top_acc is not None
    eng.on_frame(
        Frame(
            dst=100, src=7, kind=Kind.RESULT, job=7, key=top_acc, weight=6, round=1, count=6, seq=1
        )
    )
    eng.close(keep=top_acc)
    assert set(store.held) == {top_acc} and pc not in store.held


def test_checkpoints_that_do_not_fit_are_ignored() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    _finish_leaf(eng, store, sent, a, 5)
    sent.clear()
    eng.assign(1, 6)
    acc = sent[0].key
    eng.on_frame(_checkpoint(bytes(16), 6, 1, a, 2))  # not the slot's accumulator: stale
    eng.on_frame(_checkpoint(acc, 6, 1, b, 2))  # b has not finished: the top cannot have it
    eng.on_frame(_checkpoint(acc, 6, 1, 99, 2))  # not a child of the top
    assert eng.slots[1].ckpt is None and eng.slots[1].acc == acc and eng.slots[1].endpoint == 6


def test_recovery_restores_a_checkpoint_and_the_children_it_covers_without_their_objects() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, c = (s.id for s in eng.plan.slots if s.role == LEAF)
    ck = bytes([0xCC]) + bytes(15)
    store.held[ck] = 1  # adopted by the restarted gateway
    eng.restore_checkpoint(1, ck, 4.0, 4, ["c0", "c1", "c2", "c3"], [a, b])
    for leaf in (a, b):
        assert eng.superseded(leaf, done={a, b})
        eng.restore_done(leaf, bytes([leaf]) * 16, 2.0, 2, [], superseded=True)
    assert not eng.superseded(c, done={a, b})
    assert {"c0", "c3"} <= set(eng.clients)
    assert eng.needs_endpoint() == []  # the checkpoint covers all it has: parked
    pc = bytes([0xDD]) + bytes(15)
    store.held[pc] = 1
    eng.restore_done(c, pc, 2.0, 2, ["c4", "c5"])
    sent.clear()
    eng.pump([6])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL, Kind.PARTIAL]
    assert (sent[1].key, sent[1].seq) == (ck, 1) and (sent[2].key, sent[2].seq) == (pc, c)
    eng.close(keep=None)
    assert store.held == {}  # the superseded children's objects were never this gateway's


# -- plans pushed by the control plane ---------------------------------------------------------
def test_plans_with_cycles_or_childful_leaves_are_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        Plan(
            (
                Slot(1, "n", TOP, 2, None),
                Slot(2, "n", LEAF, 2, 1),
                Slot(3, "n", MIDDLE, 2, 4),
                Slot(4, "n", MIDDLE, 2, 3),
            )
        )
    with pytest.raises(ValueError, match="leaf"):
        Plan((Slot(1, "n", TOP, 2, None), Slot(2, "n", LEAF, 2, 1), Slot(3, "n", LEAF, 2, 2)))


def test_pushed_plan_json_is_checked_against_the_job() -> None:
    from gateway.replan import PlanInvalid, plan_from_json

    ok = {
        "slots": [
            {"id": 1, "node": "a", "role": 3, "goal": 3, "parent": None},
            {"id": 2, "node": "b", "role": 2, "goal": 3, "parent": 1},
            {"id": 3, "node": "b", "role": 1, "goal": 3, "parent": 2},
        ],
        "client_nodes": {"c0": "b"},
        "version": 4,
    }
    plan, version = plan_from_json(ok, nodes=["a", "b"], root="a", clients={"c0", "c1", "c2"})
    assert version == 4 and plan.node_goal("b") == 3 and plan.client_nodes == {"c0": "b"}
    with pytest.raises(PlanInvalid, match="root"):
        plan_from_json(ok, nodes=["b", "a"], root="b", clients={"c0", "c1", "c2"})
    with pytest.raises(PlanInvalid, match="unknown node"):
        plan_from_json(ok, nodes=["a"], root="a", clients={"c0", "c1", "c2"})
    with pytest.raises(PlanInvalid, match="goal mismatch"):
        plan_from_json(ok, nodes=["a", "b"], root="a", clients={"c0", "c1"})


def test_shrink_keeps_what_each_node_holds_and_drops_a_dead_node() -> None:
    from gateway.replan import PlanConflict, shrink_plan

    p = Plan(
        (
            Slot(1, "a", TOP, 9, None),
            Slot(2, "a", MIDDLE, 3, 1),
            Slot(3, "b", MIDDLE, 3, 1),
            Slot(4, "c", MIDDLE, 3, 1),
            Slot(5, "a", LEAF, 2, 2),
            Slot(6, "a", LEAF, 1, 2),
            Slot(7, "b", LEAF, 2, 3),
            Slot(8, "b", LEAF, 1, 3),
            Slot(9, "c", LEAF, 2, 4),
            Slot(10, "c", LEAF, 1, 4),
        )
    )
    s = shrink_plan(p, "a", local_held={5: 2, 6: 0}, remote_done=(), received={"b": 1})
    goals = {x.id: x.goal for x in s.slots}
    assert goals == {1: 3, 2: 2, 5: 2, 3: 1, 7: 1}  # node c (dead) and empty slots are gone
    # a remote subtree whose partial already arrived keeps its goals
    s = shrink_plan(p, "a", local_held={5: 1}, remote_done={4}, received={})
    assert {x.id: x.goal for x in s.slots} == {1: 4, 2: 1, 5: 1, 4: 3, 9: 2, 10: 1}
    with pytest.raises(PlanConflict):
        shrink_plan(p, "a", local_held={}, remote_done=(), received={"c": 0})


def test_replan_restarts_a_running_leaf_with_every_update_it_holds() -> None:
    from gateway.replan import PlanConflict

    eng, sent, _, store = engine(goal=4)  # top 1, leaves 2 and 3 with goal 2 each
    store.held[update_key(0)] = 1
    eng.add_update("c0", update_key(0), 5)
    eng.pump([5])
    first_acc = sent[0].key
    sent.clear()
    with pytest.raises(PlanConflict):  # leaf 2 holds an update: it cannot go
        eng.apply_plan(Plan((Slot(1, "n", TOP, 3, None), Slot(3, "n", LEAF, 3, 1))))
    assert eng.slots[2].acc == first_acc and sent == []  # nothing changed
    new = Plan(
        (
            Slot(1, "n", TOP, 3, None),
            Slot(2, "n", LEAF, 1, 1),
            Slot(3, "n", LEAF, 1, 1),
            Slot(4, "n", LEAF, 1, 1),
        )
    )
    assert eng.apply_plan(new, 2) == [2]
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE]
    assert sent[0].dst == 5 and sent[0].count == 1 and sent[0].key != first_acc
    assert sent[1].key == update_key(0) and first_acc in eng.slots[2].abandoned
    assert eng.capacity == 3 and eng.plan_version == 2 and not eng.full()


def test_a_slot_silent_with_all_its_inputs_runs_again_on_its_endpoint() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    add_updates(eng, store, range(3))  # leaf a gets its two updates, leaf b one of two
    eng.assign(a, 5)
    eng.assign(b, 6)
    first = eng.slots[a].acc
    sent.clear()
    now = eng.slots[a].heard_ns
    assert eng.rerun_stalled(10, now + 9 * 10**9) == []  # not silent long enough
    assert eng.rerun_stalled(10, now + 11 * 10**9) == [a]  # b still waits for an update
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE, Kind.UPDATE]
    assert sent[0].dst == 5 and sent[0].key != first and eng.slots[a].attempts == 2
    assert eng.rerun_stalled(0, now + 100 * 10**9) == []  # 0 turns it off


def test_a_lazy_slot_runs_again_once_its_endpoint_answered_failed_and_only_then() -> None:
    """A lazy slot says nothing until its last input, so silence alone re-runs none; after a
    FAILED frame from its endpoint (an object it could not use) that endpoint will never
    finish it: it runs again once silent for the stall limit (it waited for good before), and
    each FAILED frame is counted (the gateway's ``..._aggregator_failures_total``)."""
    failures: list[int] = []
    eng, sent, _, store = engine(goal=6, lazy=True, failed=lambda: failures.append(1))
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    add_updates(eng, store, range(4))
    eng.assign(a, 5)
    eng.assign(b, 6)
    first = eng.slots[a].acc
    now = eng.slots[a].heard_ns
    assert eng.rerun_stalled(10, now + 11 * 10**9) == []  # lazy: silence proves nothing

    def failed(src: int, seq: int) -> Frame:
        return Frame(
            dst=100,
            src=src,
            kind=Kind.FAILED,
            flags=int(Kind.UPDATE),
            job=7,
            key=update_key(0),
            round=1,
            count=int(Failure.MISSING),
            seq=seq,
        )

    eng.on_frame(failed(9, a))  # from an endpoint that no longer runs slot a: counted only
    assert eng.rerun_stalled(10, now + 11 * 10**9) == []
    eng.on_frame(failed(5, a))
    assert failures == [1, 1] and eng.endpoint_failures == 2
    assert update_key(0).hex() in eng.last_failure
    sent.clear()
    assert eng.rerun_stalled(10, now + 9 * 10**9) == []  # not silent long enough
    assert eng.rerun_stalled(10, now + 11 * 10**9) == [a]
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE, Kind.UPDATE]
    assert sent[0].dst == 5 and sent[0].key != first and eng.slots[a].attempts == 2
    assert eng.rerun_stalled(10, now + 100 * 10**9) == []  # the re-run has not failed (yet)


def test_a_checkpoint_or_ack_with_the_wrong_count_runs_the_slot_again() -> None:
    """An endpoint that missed a frame (its own checkpoint, say) reports a count that does
    not add up: the gateway runs it again from what it holds instead of recording it."""
    eng, sent, _, store = engine(goal=6)
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    pa = _finish_leaf(eng, store, sent, a, 5)
    _finish_leaf(eng, store, sent, b, 5)
    sent.clear()
    eng.assign(1, 6)
    acc = sent[0].key
    sent.clear()
    eng.on_frame(_checkpoint(acc, 6, 1, a, 4))  # a holds 2 updates: 4 does not add up
    assert eng.slots[1].ckpt is None and eng.slots[1].attempts == 2
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL, Kind.PARTIAL]
    assert sent[0].dst == 6 and sent[0].key != acc and pa in store.held


def test_a_jobs_slot_records_are_journaled_in_the_order_they_were_made() -> None:
    """A later checkpoint must never land before an earlier one (it would be overwritten by
    the older): ``gateway.round_io.journal_slot`` writes one job's records one at a time, in order."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter

    from gateway.background import Background, JournalRetry
    from gateway.round_io import journal_slot

    written: list[int] = []
    released: list[int] = []

    class SlowFirstJournal:
        async def slot_checkpoint(
            self, job: str, rnd: int, slot: int, rec: dict, *, node: str
        ) -> None:  # type: ignore[type-arg]
            await asyncio.sleep(0.05 if rec["count"] == 2 else 0)  # the first write is slow
            written.append(rec["count"])

    async def run() -> None:
        reg = CollectorRegistry()
        job = SimpleNamespace(
            name="j",
            journal_lock=asyncio.Lock(),
            engine=SimpleNamespace(round=1, closed=False),
        )
        gw = SimpleNamespace(
            journal=SlowFirstJournal(),
            settings=SimpleNamespace(node="n1"),
            jobs={"j": job},
            background=Background(Counter("f", "f", ["task"], registry=reg)),
            retry=JournalRetry(Counter("r", "r", ["op"], registry=reg), 1.0, threading.Event()),
        )
        for count in (2, 4):
            inp = Input(bytes(16), float(count), count)
            journal_slot(  # type: ignore[arg-type]
                gw, job, 1, 1, inp, lambda c=count: released.append(c), children=[2]
            )
        await asyncio.gather(*gw.background.tasks)

    asyncio.run(run())
    assert written == [2, 4] and released == [2, 4]


def test_an_accumulator_the_store_refuses_leaves_the_slot_waiting_and_it_starts_later() -> None:
    eng, sent, _, store = engine()
    refused: list[BaseException] = []
    eng._refused = refused.append
    store.held[update_key(0)] = 1
    eng.add_update("c0", update_key(0), 3)
    store.full = True
    assert eng.assign(2, 5) is False  # no TASK, no endpoint, no object, the input kept
    st = eng.slots[2]
    assert sent == [] and st.endpoint is None and st.acc is None and st.attempts == 0
    assert set(store.held) == {update_key(0)} and len(refused) == 1 and eng.store_refusals == 1
    eng.pump([5])  # asked again too soon: the store is not asked
    assert sent == [] and len(refused) == 1
    st.retry_ns = 0  # the pause is over
    eng.pump([5])
    assert sent == [] and len(refused) == 2 and st.endpoint is None
    store.full, st.retry_ns = False, 0
    eng.pump([5])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE] and st.endpoint == 5
    assert st.refusals == 0 and eng.progress()["store_refusals"] == 2


def test_a_rerun_the_store_refuses_frees_the_endpoint_and_makes_no_object() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    add_updates(eng, store, range(2))
    eng.assign(a, 5)
    first = eng.slots[a].acc
    now = eng.slots[a].heard_ns
    store.full = True
    sent.clear()
    held = set(store.held)
    for k in range(1, 4):  # silent, again and again, while the store is full
        eng.rerun_stalled(10, now + k * 11 * 10**9)
        eng.slots[a].retry_ns = 0
    st = eng.slots[a]
    assert sent == [] and st.endpoint is None and set(store.held) == held  # no new object
    assert st.acc == first and st.abandoned == []  # abandoned once, at the next start
    store.full = False
    eng.pump([6])
    assert [f.kind for f in sent] == [Kind.TASK, Kind.UPDATE, Kind.UPDATE] and sent[0].dst == 6
    assert st.abandoned == [first]


def test_a_spare_the_store_refuses_parks_the_slot_which_runs_again_from_its_checkpoint() -> None:
    eng, sent, _, store = engine(goal=6)
    a, b, _c = (s.id for s in eng.plan.slots if s.role == LEAF)
    pa = _finish_leaf(eng, store, sent, a, 5)
    pb = _finish_leaf(eng, store, sent, b, 5)
    sent.clear()
    eng.assign(1, 7)
    acc = sent[0].key
    sent.clear()
    store.full = True
    eng.on_frame(_checkpoint(acc, 7, 1, a, 2))
    assert sent == [] and eng.slots[1].endpoint is None and eng.slots[1].acc is None
    store.full, eng.slots[1].retry_ns = False, 0
    eng.pump([7])  # it runs again from its checkpoint with b's partial
    assert [f.kind for f in sent] == [Kind.TASK, Kind.PARTIAL, Kind.PARTIAL]
    assert sent[1].key == acc and sent[2].key == pb and pa != pb
