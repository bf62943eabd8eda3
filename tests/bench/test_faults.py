"""The fault campaign's verdicts (bench/faults.py, bench/fault_kinds.py, bench/fault_checks.py):
a run survives only when the job finished, every round's model is the FedAvg of exactly the
acknowledged updates, the checkpoints are complete, queries answer, and nothing was lost or
counted twice; a row passes only when every run also shows that its fault hit work in flight.
Pure logic on recorded runs and real models; ``make test-faults`` runs the campaign itself."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.fault_checks import (
    MAX_REL_ERR,
    Model,
    check_rounds,
    counter_delta,
    resnet18_model,
    small_model,
)
from bench.fault_kinds import FAULTS
from bench.fault_platform import JobRun, free_bytes
from bench.fault_shm import (
    SHM_FULL_S,
    SHM_HOLD_MAX_S,
    SHM_LEFT,
    first_refusal,
    hold_full,
    resize,
    shrink,
    store_full_times,
    total_bytes,
)
from bench.fault_table import passed, summary, to_markdown
from bench.faults import NOT_RUN, _Refusals, survived

GOOD = {
    "finished": True,
    "exact": True,
    "checkpoints": True,
    "queries": True,
    "lost": 0,
    "double": 0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"finished": False},
        {"exact": False},
        {"checkpoints": False},
        {"queries": False},
        {"query_in_flight": False},
        {"lost": 1},
        {"double": 1},
    ],
)
def test_any_failed_check_is_not_survived(change: dict[str, Any]) -> None:
    assert survived(JobRun("j", "replica", checks=dict(GOOD)))
    assert not survived(JobRun("j", "replica", checks={**GOOD, **change}))
    assert not survived(JobRun("j", "replica", checks=dict(GOOD), error="boom"))


def _fedavg(model: Model, ups: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    acc = sum(model.flat(s).astype(np.float64) * w for s, w in ups.values())
    return model.split((acc / sum(w for _, w in ups.values())).astype(np.float32))


def _reader(model: Model, counted: dict[int, dict[str, tuple[int, int]]], **kw: Any):  # type: ignore[no-untyped-def]
    """Rounds as a root that counted ``counted`` publishes them; ``scale`` multiplies one
    round's model, ``count`` overrides one round's meta count, ``gone`` rounds are missing."""

    def read(rnd: int):  # type: ignore[no-untyped-def]
        if rnd in kw.get("gone", ()):
            return None
        if rnd == 0:
            return {"clients": {}, "count": 0}, model.zeros()
        ups = counted[rnd]
        tensors = _fedavg(model, ups)
        if rnd == kw.get("scale_round"):
            tensors = {k: v * np.float32(kw["scale"]) for k, v in tensors.items()}
        meta = {"clients": dict.fromkeys(ups, {}), "count": kw.get("count", {}).get(rnd, len(ups))}
        return meta, tensors

    return read


def test_the_check_passes_the_exact_fedavg_and_catches_a_wrong_model_or_a_loss() -> None:
    model = small_model()
    acked = {1: {"c0": (11, 3), "c1": (12, 1)}, 2: {"c0": (21, 3), "c1": (22, 5)}}
    ok = check_rounds(model, acked, _reader(model, acked), 2, patience=0)
    assert ok["exact"] and ok["checkpoints"] and ok["lost"] == ok["double"] == 0
    assert ok["max_rel_err"] <= MAX_REL_ERR
    # a model 1e-5 off (a weight taken wrong): not exact
    off = check_rounds(
        model, acked, _reader(model, acked, scale_round=2, scale=1 + 1e-5), 2, patience=0
    )
    assert not off["exact"] and off["wrong"] == [2]
    # round 1 published without c1's acknowledged update: lost, and its model is wrong
    short = {**acked, 1: {"c0": (11, 3)}}
    lost = check_rounds(model, acked, _reader(model, short), 2, patience=0)
    assert lost["lost"] == 1 and lost["wrong"] == [1]
    # counted three times for two updates: double
    twice = check_rounds(model, acked, _reader(model, acked, count={2: 3}), 2, patience=0)
    assert twice["double"] == 1
    # no checkpoint of round 2
    gone = check_rounds(model, acked, _reader(model, acked, gone={2}), 2, patience=0)
    assert not gone["checkpoints"] and gone["missing"] == [2] and gone["lost"] == 2


def test_an_update_is_one_vector_seen_as_the_models_tensors() -> None:
    m = small_model()
    u = m.update(7)
    assert [(k, v.shape) for k, v in u.items()] == [("w", (256, 256)), ("b", (256,))]
    assert np.array_equal(m.join(u), m.flat(7)) and not np.array_equal(m.flat(7), m.flat(8))


@pytest.mark.slow  # torchvision builds the network to read its layout
def test_the_data_path_model_is_resnet18s_layout() -> None:
    m = resnet18_model()
    assert len(m.layout) == 102 and m.nbytes == 44_764_968  # 11,191,242 float32 values
    assert m.update(7)["fc.bias"].shape == (10,)


def test_a_restarted_gateways_counter_counts_from_zero() -> None:
    before = {"fedfaas_gateway_redeliveries": 4.0, "fedfaas_gateway_partial_retries": 2.0}
    after = {"fedfaas_gateway_redeliveries": 6.0, "fedfaas_gateway_partial_retries": 1.0}
    assert counter_delta(before, after) == {
        "fedfaas_gateway_redeliveries": 2.0,
        "fedfaas_gateway_partial_retries": 1.0,  # restarted: 1 since
    }


def test_a_replica_kill_is_evidence_only_when_its_slot_was_run_again() -> None:
    run = JobRun("j", "replica")
    run.injected = {"node": "node1", "slot": 7, "role": "middle", "updates": 0, "pid": 42}
    run.injected["partials"] = 2
    assert not FAULTS["replica"].evidence(run)[0]
    run.counters = {"node1": {"fedfaas_gateway_redeliveries": 1.0}}
    hit, what = FAULTS["replica"].evidence(run)
    assert hit and "pid 42 ran middle slot 7 on node1 (0 update(s), 2 partial(s) in it)" in what


def test_the_replica_killed_runs_a_leaf_that_still_waits_for_updates() -> None:
    """A slot whose last input is on its way can finish between the look and the kill, which
    then has nothing to re-run: only leaves short of their goal are chosen (holding an update
    too while work is wanted), on their own node, running, not done."""
    from bench.fault_kinds import waiting_leaves

    leaf = {"role": 1, "goal": 5, "updates": 3, "endpoint": 9, "done": False, "node": "n0"}
    slots = {
        "1": {**leaf, "role": 3, "updates": 0, "partials": 2},  # a top with partials in
        "7": leaf,
        "8": {**leaf, "updates": 4},  # one short
        "9": {**leaf, "updates": 5},  # all in: finishing
        "10": {**leaf, "done": True},
        "11": {**leaf, "endpoint": None},
        "12": {**leaf, "node": "n1"},
        "13": {**leaf, "updates": 0},  # nothing folded yet
    }
    assert [sid for sid, _ in waiting_leaves("n0", slots, need_work=True)] == [7, 8]
    assert [sid for sid, _ in waiting_leaves("n0", slots, need_work=False)] == [7, 8, 13]


def test_a_gateway_kill_is_evidence_only_when_it_held_updates_of_an_open_round() -> None:
    run = JobRun(
        "j", "gateway", injected={"node": "node1", "round": 2, "version": 1, "received": 4}
    )
    assert FAULTS["gateway"].evidence(run)[0]
    run.injected.update(version=2)  # it had published that round: nothing in flight
    assert not FAULTS["gateway"].evidence(run)[0]
    run.injected.update(version=1, received=0)
    assert not FAULTS["gateway"].evidence(run)[0]


def _phase(uploads_refused: int, store_full: float, **kw: Any) -> dict[str, Any]:
    return {
        "round": 1,
        "filled_in_s": 0.5,
        "acked_before_full": 2,
        "acked_while_full": 18,
        "store_full": store_full,
        "accumulators_refused": 3.0,
        "uploads_refused": uploads_refused,
        **kw,
    }


def test_a_full_store_is_evidence_only_with_uploads_refused_in_both_fills() -> None:
    run = JobRun("j", "shm-full")
    run.checks["full_phases"] = {"creation": _phase(2, 2.0)}
    hit, what = FAULTS["shm-full"].evidence(run)
    assert not hit and "no fill mid round" in what
    # no upload refused while the mid-round fill held the store full (af77c5b's run 0: its
    # uploads had their objects before the store filled); a partial the gateways refused
    # meanwhile is not an upload
    run.checks["full_phases"]["mid_round"] = _phase(0, 1.0, round=2)
    hit, what = FAULTS["shm-full"].evidence(run)
    assert not hit and "mid round 0 upload(s) refused store_full" in what
    run.checks["full_phases"]["mid_round"]["uploads_refused"] = 1
    hit, what = FAULTS["shm-full"].evidence(run)
    assert hit
    assert "at the job's creation 2 upload(s) refused store_full and sent again" in what
    assert "the gateways refused 1, partials included" in what
    assert "18 of round 2's uploads acknowledged while full, 2 before" in what


def test_a_fill_counts_only_the_uploads_the_sdk_sends_again_after_a_503_store_full() -> None:
    run = JobRun("j", "shm-full")
    seen = _Refusals(run)
    log = logging.getLogger("client.node")
    logging.getLogger("client").addHandler(seen)
    try:
        log.warning("c1: upload of round 1 refused for now (HTTP 503 store_full: no room)")
        log.warning("c2: upload of round 1 refused for now (HTTP 503 overloaded: budget)")
        log.warning("c3: node unreachable; retrying")
    finally:
        logging.getLogger("client").removeHandler(seen)
    assert len(store_full_times(run.refusals)) == 1


def test_a_fill_holds_the_store_full_past_a_refusal_and_only_while_uploads_can_come() -> None:
    t0 = 100.0
    assert hold_full(t0 + 30, t0, None, uploads_left=3)  # waits for an upload to refuse
    assert not hold_full(t0 + SHM_HOLD_MAX_S, t0, None, uploads_left=3)
    # the round has all its uploads: nothing can be refused, holding only stalls its slots
    assert not hold_full(t0 + 1, t0, None, uploads_left=0)
    assert hold_full(t0 + 2 + SHM_FULL_S - 0.1, t0, t0 + 2, uploads_left=0)
    assert not hold_full(t0 + 2 + SHM_FULL_S, t0, t0 + 2, uploads_left=5)
    assert first_refusal([99.0, 104.0, 101.0], t0) == 101.0
    assert first_refusal([99.0], t0) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_fill_leaves_the_tmpfs_just_short_of_one_upload_at_once_and_gives_it_back(
    tmp_path: Path,
) -> None:
    mnt = tmp_path / "shm"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", mnt], check=True)
    try:
        held = os.open(mnt / "held", os.O_WRONLY | os.O_CREAT, 0o600)
        os.posix_fallocate(held, 0, 20 * 2**20)
        size = total_bytes(mnt)
        shrink(mnt)
        assert free_bytes(mnt) == SHM_LEFT
        new = os.open(mnt / "upload", os.O_WRONLY | os.O_CREAT, 0o600)
        with pytest.raises(OSError) as refused:
            os.posix_fallocate(new, 0, SHM_LEFT + 2**20)
        assert refused.value.errno == errno.ENOSPC
        os.close(held)
        (mnt / "held").unlink()  # the platform frees pages: the next shrink takes them back
        shrink(mnt)
        assert free_bytes(mnt) == SHM_LEFT
        resize(mnt, size)
        os.posix_fallocate(new, 0, 32 * 2**20)
        os.close(new)
        assert total_bytes(mnt) == size
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)


def _job(ok: bool, recovery: float | None, lost: int = 0, hit: bool = True) -> dict[str, Any]:
    return {
        "job": "j",
        "survived": ok,
        "hit": hit,
        "evidence": "node1 killed holding 4 accepted update(s) of round 2" if hit else "none",
        "acked": 40,
        "resent": 0,
        "injected": {},
        "recovery_s": recovery,
        "checks": {**GOOD, "lost": lost, "exact": ok},
        "error": "",
    }


def test_the_table_row_sums_runs_and_names_why_not() -> None:
    fault = {
        "fault": "gateway",
        "letter": "b",
        "what": FAULTS["gateway"].what,
        "model": "ResNet-18",
        "leftovers": {"shm": [], "processes": [4242]},
        "jobs": [_job(True, 1.0), _job(True, 3.0, hit=False), _job(False, None, lost=2)],
    }
    row = summary(fault)
    assert row["runs"] == 3 and row["survived"] == 2 and row["hit"] == 2 and row["acked"] == 120
    assert row["lost"] == 2 and row["double"] == 0
    assert row["recovery_p50_s"] == pytest.approx(2.0)
    assert row["left_behind"] is True and not passed(row)
    assert row["why_not"] == ["exact", "not shown to hit work in flight: none"]
    md = to_markdown(
        {
            "run": {"argv": ["x"], "command": "x", "commit": {}, "machine": {}},
            "clients": 20,
            "rounds": 2,
            "faults": [fault],
            "not_run": {**NOT_RUN, "k": "shm nearly full: cannot mount a 4096 MiB tmpfs"},
        }
    )
    assert "| (b) SIGKILL of a non-root node gateway | ResNet-18 | 3 | 2 | 2 | 120 | 2 | 0 |" in md
    assert "node1 killed holding 4 accepted update(s) of round 2" in md
    assert "Not run:\n- (k) shm nearly full: cannot mount a 4096 MiB tmpfs" in md
    fault["jobs"] = [_job(True, 1.0)] * 3
    fault["leftovers"] = {"shm": [], "processes": []}
    assert passed(summary(fault))


def test_every_fault_of_issues_13_and_35_is_run_or_said_not_run() -> None:
    """(a)-(l) of issue 13's list, (c2) (the root node lost for good), and issue 35's (m) a
    Redis error at the publication and (n) a partial undeliverable at the root."""
    letters = {f.letter for f in FAULTS.values()} | set(NOT_RUN)
    assert letters == set("abcdefghijklmn") | {"c2"}
    assert FAULTS["root-node"].letter == "c2" and FAULTS["root-node"].holds == "root"
    assert FAULTS["partial-undeliverable"].holds == "other"
    # the data path's faults upload ResNet-18-sized updates; FLStore's keep small ones
    assert {n for n, f in FAULTS.items() if f.small_model} == {
        "cache-engine",
        "cache-function",
        "request-tracker",
    }
