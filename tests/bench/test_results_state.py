"""bench.results_state: the check that every stored result names one landed commit, clean."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench import results_state as rs
from bench.runinfo import ROOT

HEAD = subprocess.run(
    ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
).stdout.strip()
UNKNOWN = "0123456789abcdef0123456789abcdef01234567"


def _store(folder: Path, name: str, sha: str | None, dirty: bool | None = False) -> None:
    body: dict[str, object] = {"figure": 1.0}
    if sha is not None:
        body["run"] = {
            "commit": {"sha": sha, "dirty": dirty},
            "started": "2026-11-27T00:00:00+00:00",
            "command": f"python -m bench.{name}",
        }
    (folder / f"{name}.json").write_text(json.dumps(body))


def test_one_landed_clean_commit_passes(tmp_path: Path) -> None:
    for name in ("dataplane", "scale", "robust"):
        _store(tmp_path, name, HEAD)
    got = rs.state(tmp_path)
    assert got["problems"] == []
    assert rs.main(["--results", str(tmp_path)]) == 0


def test_every_way_of_not_being_one_commit_is_named(tmp_path: Path) -> None:
    _store(tmp_path, "dataplane", HEAD)
    _store(tmp_path, "scale", HEAD, dirty=True)
    _store(tmp_path, "control", UNKNOWN)
    _store(tmp_path, "flower_baseline", None)
    (tmp_path / "broken.json").write_text("not json")
    found = rs.state(tmp_path)["problems"]
    assert "scale: from an uncommitted tree at " + HEAD[:9] in found
    assert "flower_baseline: no run record with a commit" in found
    assert "broken: no run record with a commit" in found
    assert f"commit {UNKNOWN[:9]} is not in this history" in found
    [several] = [p for p in found if p.startswith("2 commits")]
    assert "dataplane" in several and "control" in several
    assert rs.main(["--results", str(tmp_path)]) == 1


def test_landed_asks_git() -> None:
    assert rs.landed(HEAD)
    assert not rs.landed(UNKNOWN)


def test_an_empty_folder_is_not_a_result(tmp_path: Path) -> None:
    assert rs.problems([], rs.landed) == ["no stored results"]


def test_the_table_says_each_results_commit(tmp_path: Path) -> None:
    _store(tmp_path, "dataplane", HEAD)
    _store(tmp_path, "scale", HEAD, dirty=True)
    got = rs.state(tmp_path)
    text = rs.render(got["rows"], got["problems"])
    assert f"| dataplane | {HEAD[:9]} | yes |" in text
    assert f"| scale | {HEAD[:9]} | no |" in text
    assert "Not one landed commit's clean results:" in text
