"""The sharded round's bookkeeping (``gateway/sharded.py``), with a real store and frames
captured instead of sent: shards wait for every update, go one per endpoint, run again when
their endpoint disconnects or stays silent, and only the current holder's answer counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bpf import Frame, Kind
from core import shards, wire
from core.objstore import Namespace
from core.robust import RobustRule
from gateway.plan import static_plan
from gateway.sharded import ShardedRound
from gateway.slots import Input


def _round(tmp_path: Path, spec: dict, goal: int = 5):  # type: ignore[no-untyped-def]
    model = wire.ModelSpec.build([("w", "F32", (100,))])
    ns = Namespace(tmp_path / "shm", "n", "j", model.object_nbytes, pool=goal + 3)
    g = ns.allocate()
    g.close()
    ns.seal(g.key)
    sent: list[Frame] = []
    published: list[Input] = []
    eng = ShardedRound(
        rule=RobustRule.from_json(spec),
        spec=model,
        expected=goal,
        base=lambda: g.key_bytes,
        width=lambda: 2,
        job_id=7,
        node="n",
        round=1,
        plan=static_plan(goal, [f"c{i}" for i in range(goal)], ["n"], 2),
        store=ns,
        gateway_ep=100,
        send=sent.append,
        publish=published.append,
    )
    return eng, ns, sent, published


def _update(ns: Namespace) -> bytes:
    o = ns.allocate()
    o.close()
    ns.seal(o.key)
    return o.key_bytes


def _done(eng: ShardedRound, f: Frame, src: int | None = None) -> None:
    eng.on_frame(
        Frame(
            dst=100,
            src=f.dst if src is None else src,
            kind=Kind.SHARD_DONE,
            flags=f.flags,
            job=7,
            key=f.key,
            round=1,
            seq=f.seq,
        )
    )


def answer_gram(ns: Namespace, f: Frame) -> None:
    """What the endpoint would write for Krum's Gram pass (one shard) of 5 updates: c3 is
    central."""
    with ns.open_writable(f.key) as man:
        p = shards.read(man.buf)
        x = np.array([0.0, 1.0, 2.0, 1.1, 9.0])
        shards.results(man.buf, p)[0] = np.outer(x, x)


def test_shards_wait_for_the_goal_then_take_one_endpoint_each(tmp_path: Path) -> None:
    eng, ns, sent, published = _round(tmp_path, {"rule": "median"})
    for i in range(4):
        eng.add_update(f"c{i}", _update(ns), 10.0)
    assert eng.wanted() == 0 and eng.stage is None  # 4 of 5: nothing to do yet
    eng.add_update("c4", _update(ns), 10.0)
    assert eng.stage == shards.ORDER and eng.wanted() == 2 and eng.pending() == 2
    eng.run_shards([1])
    assert [(f.kind, f.dst, f.seq) for f in sent] == [(Kind.SHARD, 1, 0)]
    assert eng.busy_endpoints() == {1} and eng.wanted() == 1
    with ns.open(sent[0].key) as man:
        p = shards.read(man.buf)
    assert p.inputs == [i.key for i in eng.inputs] and p.bounds[0] == 0 and p.shards == 2
    eng.run_shards([2])
    _done(eng, sent[0])
    assert not published
    _done(eng, sent[1])
    assert len(published) == 1 and published[0].count == 5 and published[0].weight == 50.0
    assert ns.sealed(published[0].key)
    assert eng.decision["aggregated"] == [f"c{i}" for i in range(5)]


def test_a_shard_whose_endpoint_goes_runs_again_and_the_old_answer_is_ignored(
    tmp_path: Path,
) -> None:
    eng, ns, sent, published = _round(tmp_path, {"rule": "median", "shards": 2})
    for i in range(5):
        eng.add_update(f"c{i}", _update(ns), 1.0)
    eng.run_shards([1, 2])
    assert eng.on_disconnect(1) == [0] and eng.wanted() == 1
    eng.run_shards([3])
    assert (sent[-1].dst, sent[-1].seq) == (3, 0)
    _done(eng, sent[0], src=1)  # the gone endpoint's late answer
    _done(eng, sent[1])
    assert not published
    _done(eng, sent[-1])
    assert len(published) == 1


def test_a_silent_shard_is_sent_again_to_its_endpoint(tmp_path: Path) -> None:
    eng, ns, sent, _ = _round(tmp_path, {"rule": "trimmed-mean", "beta": 0.2})
    for i in range(5):
        eng.add_update(f"c{i}", _update(ns), 1.0)
    eng.run_shards([1, 2])
    t = max(t for _, t in eng.running.values())
    assert eng.rerun_stalled(10.0, now_ns=t + 5 * 10**9) == []
    assert sorted(eng.rerun_stalled(10.0, now_ns=t + 11 * 10**9)) == [0, 1]
    assert [(f.dst, f.seq) for f in sent[2:]] == [(1, 0), (2, 1)]


def test_krum_runs_a_gram_pass_then_a_linear_one_with_the_chosen_coefficients(
    tmp_path: Path,
) -> None:
    eng, ns, sent, published = _round(tmp_path, {"rule": "krum", "f": 1, "shards": 1})
    for i in range(5):
        eng.add_update(f"c{i}", _update(ns), 1.0)
    assert eng.stage == shards.GRAM
    eng.run_shards([1])
    answer_gram(ns, sent[0])
    _done(eng, sent[0])
    assert eng.stage == shards.LINEAR and eng.decision["selected"] == ["c3"]
    with ns.open(eng.manifest or b"") as man:
        assert shards.read(man.buf).coef == [0.0, 0.0, 0.0, 1.0, 0.0]
    eng.run_shards([1])
    _done(eng, sent[-1])
    assert published and published[0].count == 1


def test_too_few_updates_for_the_rule_keep_the_model_and_say_why(tmp_path: Path) -> None:
    eng, ns, sent, published = _round(tmp_path, {"rule": "krum", "f": 3}, goal=5)
    for i in range(5):
        eng.add_update(f"c{i}", _update(ns), 1.0)
    assert eng.stage == shards.LINEAR and "at least 6" in eng.decision["skipped"]
    eng.run_shards([1, 2])
    for f in sent:
        _done(eng, f)
    assert published and published[0].count == 0
