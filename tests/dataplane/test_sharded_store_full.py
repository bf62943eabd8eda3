"""A robust rule's sharded round (``gateway/sharded.py``) on a store that refuses its objects:
the start waits, holds nothing, and runs once there is room.

Regression: the round's output object was allocated at the start of aggregation with nothing
to catch a refusal (``ENOSPC`` on a full ``/dev/shm``), so the last upload, journaled and in
the round, raised out of the round and was answered 500; the round never started again. Now
the refusal is counted (``fedfaas_gateway_accumulators_refused``), the round holds no object
for the start, the pump asks the store again after ``STORE_RETRY_S``, and the round publishes
the exact robust answer once the store has room.

- With a real gateway on a 16 MiB tmpfs filled to the last page (the ballast of
  ``test_store_full.py``), a median job whose last upload lands in a pre-faulted buffer.
- The round alone, with a real store whose allocations fail ``ENOSPC`` on demand: the output
  object, the first pass's manifest (the output is then given back) and Krum's second pass's
  manifest after its Gram pass (its coefficients wait).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from client.sdk import with_metadata
from core import robust, shards, wire
from core.objstore import MappedObject, Namespace
from core.robust import METADATA_KEY, RobustRule
from gateway.replan import PlanConflict
from gateway.sharded import ShardedRound
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread
from tests.dataplane.rounds import post_update, wait_version
from tests.dataplane.test_robust_gateway import _flat, _model
from tests.dataplane.test_sharded_round import _done, _update, answer_gram
from tests.dataplane.test_sharded_round import _round as sharded_round
from tests.dataplane.test_store_full import Ballast, small_fs  # noqa: F401 (a fixture)
from tests.polling import wait_until

CLIENTS = [f"c{i}" for i in range(5)]
SPEC = {"rule": "median", "shards": 2}


# -- the round alone ------------------------------------------------------------------------
class Refusals:
    """Makes a real store's allocations fail as a full memory file system makes them fail
    (``full``; ``files_only``: only plain files, such as a pass's manifest)."""

    def __init__(self, ns: Namespace) -> None:
        self.full = self.files_only = False
        real = ns.allocate

        def allocate(nbytes: int | None = None) -> MappedObject:
            if self.full and (nbytes is not None or not self.files_only):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(nbytes)

        ns.allocate = allocate  # type: ignore[method-assign]


def _round(tmp_path: Path, spec: dict):  # type: ignore[no-untyped-def]
    """test_sharded_round's round of goal 5 holding 4 updates, its store's refusals in hand."""
    eng, ns, sent, published = sharded_round(tmp_path, spec)
    refused: list[BaseException] = []
    eng._refused = refused.append
    for i in range(4):
        eng.add_update(f"c{i}", _update(ns), 1.0)
    return eng, ns, sent, published, refused, Refusals(ns)


def _pause_over(eng: ShardedRound) -> None:
    eng._out_wait.retry_ns = eng._pass_wait.retry_ns = 0


def test_a_refused_output_leaves_the_round_waiting_with_no_object_until_there_is_room(
    tmp_path: Path,
) -> None:
    eng, ns, sent, published, refused, store = _round(tmp_path, SPEC)
    last = _update(ns)
    held = ns.stats()["objects"]
    store.full = True
    eng.add_update("c4", last, 1.0)  # the goal: the start is refused, nothing raised
    assert eng.stage is None and eng.out_key is None and eng.wanted() == 0 and sent == []
    assert len(refused) == 1 and eng.store_refusals == 1 and ns.stats()["objects"] == held
    eng.start_if_ready()  # asked again too soon: the store is not asked
    assert len(refused) == 1
    _pause_over(eng)
    eng.start_if_ready()
    assert len(refused) == 2 and eng.stage is None
    store.full = False
    _pause_over(eng)
    eng.start_if_ready()  # what every pump calls (gateway.endpoints)
    assert eng.stage == shards.ORDER and eng.wanted() == 2
    assert ns.stats()["objects"] == held + 2  # the output and the manifest
    eng.run_shards([1, 2])
    for f in list(sent):
        _done(eng, f)
    assert len(published) == 1 and published[0].count == 5
    assert eng.progress()["store_refusals"] == 2


def test_a_refused_manifest_gives_the_output_back(tmp_path: Path) -> None:
    eng, ns, sent, published, refused, store = _round(tmp_path, SPEC)
    held = ns.stats()["objects"]
    store.full = store.files_only = True  # the output finds room, its manifest none
    eng.add_update("c4", _update(ns), 1.0)
    assert eng.stage is None and eng.out_key is None and len(refused) == 1
    assert ns.stats()["objects"] == held + 1  # c4's update; the output was given back
    eng.start_if_ready()  # the manifest's pause holds the whole start: no output taken
    assert ns.stats()["objects"] == held + 1 and len(refused) == 1
    store.full = False
    _pause_over(eng)
    eng.start_if_ready()
    assert eng.stage == shards.ORDER and eng.out_key is not None


def test_krums_second_pass_waits_for_its_manifest_with_its_coefficients(tmp_path: Path) -> None:
    eng, ns, sent, published, refused, store = _round(
        tmp_path, {"rule": "krum", "f": 1, "shards": 1}
    )
    eng.add_update("c4", _update(ns), 1.0)
    assert eng.stage == shards.GRAM
    eng.run_shards([1])
    answer_gram(ns, sent[0])
    gram_manifest = eng.manifest
    store.full = True
    _done(eng, sent[0])  # the Gram pass is done; the linear pass's manifest is refused
    assert eng.stage == shards.GRAM and eng.manifest == gram_manifest and eng.wanted() == 0
    assert eng.decision["selected"] == ["c3"] and len(refused) == 1
    with pytest.raises(PlanConflict, match="aggregating"):
        eng.check_plan(eng.plan)  # still aggregating: no new plan
    store.full = False
    _pause_over(eng)
    eng.start_if_ready()
    assert eng.stage == shards.LINEAR and eng.manifest != gram_manifest and eng.wanted() == 1
    with ns.open(eng.manifest or b"") as man:
        assert shards.read(man.buf).coef == [0.0, 0.0, 0.0, 1.0, 0.0]
    eng.run_shards([1])
    _done(eng, sent[-1])
    assert published and published[0].count == 1


# -- a real gateway on a full tmpfs ---------------------------------------------------------
def _create(gw: GatewayThread) -> httpx.Response:
    body = with_metadata(
        wire.encode_tensors(_model(np.random.default_rng(0))), {METADATA_KEY: json.dumps(SPEC)}
    )
    return httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=body,
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
        timeout=60,
    )


@pytest.mark.integration
def test_a_robust_rounds_output_the_full_store_refuses_waits_and_the_round_closes_exact(
    make_gw,
    small_fs: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:  # type: ignore[no-untyped-def]
    # pool: the model and every update take a pre-faulted buffer; the output finds none
    gw: GatewayThread = make_gw(shm_root=small_fs / "store", pool=1 + len(CLIENTS))
    r = _create(gw)
    assert r.status_code == 201, r.text
    tokens = dict(r.json()["tokens"])
    job = gw.gw.jobs["j1"]
    g = _model(np.random.default_rng(0))
    rng = np.random.default_rng(3)
    ups = {c: _model(rng, g, bad=c == "c0") for c in CLIENTS}
    aggs = Aggregators(gw)
    ballast = Ballast(small_fs)
    try:
        aggs.start(1, endpoints=2)
        ballast.fill()
        for c in CLIENTS:  # the last one reaches the goal: the start of aggregation
            r = post_update(gw.url, "j1", 1, tokens[c], c, wire.encode_tensors(ups[c]), 10)
            assert r.status_code == 202, r.text  # journaled and in the round: acknowledged
        eng = job.engine
        assert isinstance(eng, ShardedRound) and eng.accepted == len(CLIENTS)
        # the pump asks the store again and again while it is full; nothing is started
        wait_until(lambda: eng.store_refusals >= 2, 30, "the start asked again by the pump")
        assert eng.stage is None and eng.out_key is None and eng.result is None
        assert job.ns.stats()["objects"] == 1 + len(CLIENTS)  # the model and the updates
        refused = gw.gw.metrics.registry.get_sample_value(
            "fedfaas_gateway_accumulators_refused_total"
        )
        assert (refused or 0) >= 2
    finally:
        ballast.empty()
    try:
        got = _flat(wait_version(gw.url, tokens["c1"], 1))
        want = robust.reference(
            RobustRule.from_json(SPEC),
            [_flat(ups[c]) for c in CLIENTS],
            _flat(g),
            [10] * len(CLIENTS),
            None,
        )
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert eng.decision["aggregated"] == CLIENTS  # every acknowledged update weighs in
        assert job.dropped_updates == 0
        wait_until(lambda: job.ns.stats()["objects"] == 1, 30, "only the new model left")
    finally:
        aggs.stop()
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert not tracebacks, [rec.getMessage() for rec in tracebacks]
