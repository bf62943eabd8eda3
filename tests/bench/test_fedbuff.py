"""bench.fedbuff: sync FedAvg and async FedBuff repeated, alternating; each repeat's target its
own sync job's final accuracy; medians [min-max] of the time to the target and the ratio of
the medians; a repeat that never reaches the target is counted, not timed. The slow test runs
the benchmark itself, small (2 sync rounds, 2 repeats), on a real platform."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import fedbuff


def _curve(points: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"version": i + 1, "accuracy": a, "seconds": s} for i, (s, a) in enumerate(points)]


def _repeat(rep: int, sync_s: float, async_s: float | None) -> dict[str, Any]:
    sync = _curve([(sync_s / 2, 0.8), (sync_s, 0.9)])
    asyn = _curve([(1.0, 0.85), (async_s or 9.0, 0.9 if async_s else 0.88)])
    return {
        "repeat": rep,
        "target_accuracy": 0.9,
        "sync": {"curve": sync, "reached": fedbuff._first_reaching(sync, 0.9)},
        "async": {"curve": asyn, "reached": fedbuff._first_reaching(asyn, 0.9)},
    }


def _result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A stored result of ``runs`` as bench.fedbuff writes it (its summary computed)."""
    return {
        "run": {"command": "python -m bench.fedbuff", "commit": {"sha": "abc"}},
        "setup": {"clients": 20, "slow_clients": 6, "slowdown": 5.0, "model": "softmax",
                  "async_buffer": 5, "staleness": "poly", "sync_rounds": 5},
        "order": "interleaved: sync, async, then again",
        "runs": runs,
        "summary": fedbuff.summary(runs),
    }  # fmt: skip


def test_the_summary_gives_medians_and_the_ratio_of_medians() -> None:
    runs = [_repeat(0, 20.0, 10.0), _repeat(1, 30.0, 12.0), _repeat(2, 25.0, None)]
    s = fedbuff.summary(runs)
    assert s["sync"]["seconds"] == {"median": 25.0, "min": 20.0, "max": 30.0, "n": 3}
    # the repeat that missed the target is counted and not timed
    assert s["async"]["reached"] == 2 and s["async"]["seconds"]["median"] == 11.0
    assert s["speedup_of_medians"] == pytest.approx(25.0 / 11.0)
    md = fedbuff.render(_result(runs))
    assert "| async | 2/3 | 11.00 [10.00-12.00] |" in md
    assert "| sync | 3/3 | 25.00 [20.00-30.00] |" in md
    assert "(ratio of medians): **2.27x**" in md


def test_a_mode_that_never_reached_the_target_is_named_with_its_best_accuracy() -> None:
    # the stored result at 1d83e63 said "Async or sync never reached the target" when sync had
    # reached it in every repeat and async in none
    runs = [_repeat(0, 20.0, None), _repeat(1, 30.0, None), _repeat(2, 25.0, None)]
    runs[1]["async"]["curve"][-1]["accuracy"] = 0.87
    md = fedbuff.render(_result(runs))
    assert "| sync | 3/3 |" in md and "| async | 0/3 | - |" in md
    # the best of each async curve: 0.88, 0.87, 0.88
    assert (
        "No ratio: async reached the target in 0 of 3 repeats "
        "(its best accuracy 0.880 [0.870-0.880])." in md
    )
    assert " sync reached" not in md and "ratio of medians" not in md


@pytest.mark.slow
@pytest.mark.integration
def test_the_benchmark_alternates_sync_and_async_on_one_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fedbuff, "ROUNDS", 2)
    assert fedbuff.main(["--out", str(tmp_path), "--repeats", "2"]) == 0
    res = json.loads((tmp_path / "async.json").read_text())
    assert [r["repeat"] for r in res["runs"]] == [0, 1]
    for r in res["runs"]:
        assert len(r["sync"]["curve"]) == 2  # every round published
        assert r["sync"]["reached"] is not None  # its own final model reaches its target
        assert 0 < r["target_accuracy"] <= 1
    assert res["summary"]["sync"]["reached"] == 2
    # async ran in every repeat; whether 8 models of it reach the sync job's final accuracy is
    # the benchmark's finding, not the code's correctness (a CI run saw 0/2 at 2 rounds)
    assert all(len(r["async"]["curve"]) > 0 for r in res["runs"])
    md = (tmp_path / "async.md").read_text()
    if res["summary"]["async"]["reached"]:
        assert "ratio of medians" in md
    else:
        assert "async reached the target in 0 of 2 repeats" in md
        assert "ratio of medians" not in md
    assert (tmp_path / "async.png").stat().st_size > 0


def test_by_default_each_mode_runs_as_often_as_issue_37_asks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[int] = []

    def record(out: Path, repeats: int) -> dict[str, Any]:
        asked.append(repeats)
        raise SystemExit(0)

    monkeypatch.setattr(fedbuff, "run", record)
    with pytest.raises(SystemExit):
        fedbuff.main(["--out", str(tmp_path)])
    assert asked and asked[0] >= 5
