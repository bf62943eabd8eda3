"""The fault campaign's verdicts (bench/faults.py): a run survives only when the job finished,
every round's model is the FedAvg of exactly the acknowledged updates, the checkpoints are
complete, queries answer, and nothing was lost or counted twice. Pure logic on recorded runs;
``make test-faults`` runs the campaign itself."""

from __future__ import annotations

from typing import Any

import pytest

from bench.faults import FAULTS, NOT_RUN, JobRun, summary, survived, to_markdown

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


def _job(ok: bool, recovery: float | None, lost: int = 0) -> dict[str, Any]:
    return {
        "job": "j",
        "survived": ok,
        "acked": 16,
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
        "leftovers": {"shm": [], "processes": [4242]},
        "jobs": [_job(True, 1.0), _job(True, 3.0), _job(False, None, lost=2)],
    }
    row = summary(fault)
    assert row["runs"] == 3 and row["survived"] == 2 and row["acked"] == 48
    assert row["lost"] == 2 and row["double"] == 0
    assert row["recovery_p50_s"] == pytest.approx(2.0)
    assert row["left_behind"] is True
    assert row["why_not"] == ["exact"]
    md = to_markdown(
        {
            "run": {"argv": ["x"], "command": "x", "commit": {}, "machine": {}},
            "clients": 8,
            "rounds": 2,
            "faults": [fault],
            "not_run": {**NOT_RUN, "k": "shm nearly full: cannot mount a 64 MiB tmpfs"},
        }
    )
    assert "| (b) SIGKILL of a non-root node gateway | 3 | 2 | 48 | 2 | 0 | 0 | 2.00 |" in md
    assert "Not run:\n- (k) shm nearly full: cannot mount a 64 MiB tmpfs" in md


def test_every_fault_of_issue_13_is_run_or_said_not_run() -> None:
    """(a)-(l) of the issue's list, and (c2): its item 1, the root node lost for good."""
    letters = {f.letter for f in FAULTS.values()} | set(NOT_RUN)
    assert letters == set("abcdefghijkl") | {"c2"}
    assert FAULTS["root-node"].letter == "c2" and FAULTS["root-node"].holds_a_client
