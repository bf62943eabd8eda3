"""A run of some faults of the campaign (``python -m bench.faults --faults ...``) merges its
rows into the stored result (``bench.fault_table.merge_results``): the rows it ran replace
theirs, the others are kept with the record of the run that made them, and the table names
each row's commit. Pure logic on small result dicts; the campaign itself is not run (its one
fault run is a canned row)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bench.faults
from bench.fault_kinds import CLIENTS, FAULTS, ROUNDS
from bench.fault_table import merge_results, stored_result, to_markdown
from bench.runinfo import ROOT

ORDER = [f.letter for f in FAULTS.values()]


def _run(sha: str, started: str) -> dict[str, Any]:
    return {
        "commit": {"sha": sha, "dirty": False},
        "started": started,
        "finished": started,
        "command": "python -m bench.faults",
        "machine": {"cores": 2},
    }


def _row(letter: str, acked: int = 60, tls: bool = True) -> dict[str, Any]:
    job = {
        "job": f"{letter}-0",
        "survived": True,
        "hit": True,
        "evidence": f"evidence of {letter}",
        "acked": acked,
        "recovery_s": 1.5,
        "checks": {"lost": 0, "double": 0},
        "error": None,
    }
    return {
        "fault": letter,
        "letter": letter,
        "what": f"fault {letter}",
        "model": "resnet18",
        "leftovers": {"shm": [], "processes": []},
        "jobs": [job],
        "tls": tls,
    }


OLD_RUN = _run("5341d81c9d89174875423c15e35a9026a906bbf2", "2026-11-26T15:01:29.802+00:00")
NEW_RUN = _run("299b68c0000000000000000000000000000000aa", "2026-11-26T21:00:00.000+00:00")


def _result(run: dict[str, Any], rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"run": run, "clients": 20, "rounds": 3, "runs": 3, "faults": rows, **kw}


def test_the_rows_run_replace_theirs_and_the_others_keep_their_own_run() -> None:
    old = _result(OLD_RUN, [_row("a"), _row("b"), _row("k", acked=10)], not_run={})
    new = _result(NEW_RUN, [_row("k", acked=99)], not_run={}, runs=1)
    before = copy.deepcopy((old, new))
    merged = merge_results(old, new, ORDER)
    assert (old, new) == before  # neither argument changed
    assert [f["letter"] for f in merged["faults"]] == ["a", "b", "k"]
    by = {f["letter"]: f for f in merged["faults"]}
    assert by["k"]["jobs"][0]["acked"] == 99 and by["k"]["run"] == NEW_RUN
    assert by["a"]["run"] == OLD_RUN and by["b"]["run"] == OLD_RUN  # a stored row without
    assert by["a"]["clients"] == 20 and by["a"]["rounds"] == 3  # one gets its result's
    assert merged["run"] == NEW_RUN and merged["runs"] == 1


def test_a_rows_own_run_record_survives_a_second_merge() -> None:
    first = merge_results(
        _result(OLD_RUN, [_row("a"), _row("b")]), _result(NEW_RUN, [_row("b")]), ORDER
    )
    third_run = _run("c0ffee" + "0" * 34, "2026-11-27T08:00:00.000+00:00")
    second = merge_results(first, _result(third_run, [_row("a")]), ORDER)
    assert {f["letter"]: f["run"]["commit"]["sha"][:6] for f in second["faults"]} == {
        "a": "c0ffee",
        "b": "299b68",
    }


def test_not_run_lines_follow_the_faults_tried() -> None:
    old = _result(
        OLD_RUN, [_row("a"), _row("j")], not_run={"k": "shm full: no tmpfs", "l": "no netns"}
    )
    # k runs now; j cannot run on this machine any more: its old row goes with it
    new = _result(NEW_RUN, [_row("k")], not_run={"j": "minio: no binary"})
    merged = merge_results(old, new, ORDER)
    assert [f["letter"] for f in merged["faults"]] == ["a", "k"]
    assert merged["not_run"] == {"j": "minio: no binary", "l": "no netns"}


def test_rows_come_in_the_campaigns_order_and_a_first_run_merges_into_nothing() -> None:
    new = _result(NEW_RUN, [_row("n"), _row("c2"), _row("a")])
    merged = merge_results(None, new, ORDER)
    assert [f["letter"] for f in merged["faults"]] == ["a", "c2", "n"]
    assert all(f["run"] == NEW_RUN for f in merged["faults"])


def test_the_table_names_each_rows_commit_and_the_earlier_runs() -> None:
    old = _result(OLD_RUN, [_row("a"), _row("b", tls=False)])
    del old["faults"][0]["tls"]  # a row of a run before the campaign recorded it: plain HTTP
    new = _result(NEW_RUN, [_row("b")], clients=24)
    md = to_markdown(json.loads(json.dumps(merge_results(old, new, ORDER))))
    lines = {ln.split(" | ")[0]: ln for ln in md.splitlines() if ln.startswith("| (")}
    assert lines["| (a) fault a"].endswith(
        "| 5341d81 plain HTTP 2026-11-26 15:01 (20 clients, 3 rounds) |"
    )
    assert lines["| (b) fault b"].endswith("| 299b68c 2026-11-26 21:00 |")  # TLS, the default
    assert "TLS (its default; the run column says `plain HTTP`" in md
    header = next(ln for ln in md.splitlines() if ln.startswith("| fault |"))
    assert header.endswith("| why not | run |")
    assert "Rows made by earlier runs:" in md and "commit 5341d81c9d89" in md
    assert md.count("commit 299b68c00000") == 1  # the latest run: the header alone


def test_a_stored_result_is_read_before_the_campaign_and_a_bad_one_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "faults.json"
    assert stored_result(path) is None
    path.write_text("{not json")
    assert "is not a fault campaign result" in str(stored_result(path))
    path.write_text('{"run": {}}')
    assert "no faults list" in str(stored_result(path))
    with pytest.raises(SystemExit) as exc:  # refused before any fault runs
        bench.faults.main(["--faults", "replica", "--out", str(tmp_path)])
    assert exc.value.code == 2


def test_main_merges_a_run_of_one_fault_into_the_stored_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _result(OLD_RUN, [_row("a"), _row("b")], clients=CLIENTS, rounds=ROUNDS)
    (tmp_path / "faults.json").write_text(json.dumps(old))
    ran: list[str] = []

    def canned(fault, runs, seed, outage, keep_logs=None):  # type: ignore[no-untyped-def]
        ran.append(fault.name)
        return _row(fault.letter, acked=7)

    monkeypatch.setattr(bench.faults, "run_fault", canned)
    assert bench.faults.main(["--faults", "gateway", "--runs", "1", "--out", str(tmp_path)]) == 0
    assert ran == ["gateway"]
    stored = json.loads((tmp_path / "faults.json").read_text())
    by = {f["letter"]: f for f in stored["faults"]}
    assert sorted(by) == ["a", "b"] and by["b"]["jobs"][0]["acked"] == 7
    assert by["a"]["run"]["commit"]["sha"] == OLD_RUN["commit"]["sha"]
    assert by["b"]["run"] == stored["run"] and stored["run"]["finished"]
    md = (tmp_path / "faults.md").read_text()
    row_a = next(ln for ln in md.splitlines() if ln.startswith("| (a) fault a |"))
    assert row_a.endswith("| 5341d81 2026-11-26 15:01 |") and "Rows made by earlier runs:" in md


def test_help_says_a_run_of_some_faults_merges() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    flat = " ".join(out.split())
    assert "merged into OUT/faults.json and faults.md" in flat
    assert "every other row is kept with its own run record (commit, start)" in flat
