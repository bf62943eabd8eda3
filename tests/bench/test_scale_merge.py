"""bench.scale --merge: the two axes as two runs of one commit, one result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scale

CLEAN = {"sha": "a" * 40, "dirty": False}


def _stored(folder: Path, commit: dict[str, object], points: list[dict[str, object]]) -> Path:
    path = folder / "scale.json"
    path.write_text(json.dumps({"run": {"commit": commit, "command": "x"}, "points": points}))
    return path


def test_the_other_axis_is_kept_and_its_run_named(tmp_path: Path) -> None:
    clients_axis = scale.points(sizes=())
    sizes_axis = scale.points(clients=())
    assert clients_axis and sizes_axis
    assert {p["axis"] for p in clients_axis} == {"clients"}
    assert {p["axis"] for p in sizes_axis} == {"size"}
    assert {p["clients"] for p in sizes_axis} == {scale.CLIENTS[0]}
    stored = _stored(tmp_path, CLEAN, [{**p, "compare": {}} for p in clients_axis])
    kept, earlier = scale.merged_from(stored, {"commit": CLEAN}, sizes_axis)
    assert [scale._key(p) for p in kept] == [scale._key(p) for p in clients_axis]
    assert earlier == [{"commit": CLEAN, "command": "x"}]
    # a point run again replaces the stored one
    kept, _ = scale.merged_from(stored, {"commit": CLEAN}, clients_axis[:1])
    assert [scale._key(p) for p in kept] == [scale._key(p) for p in clients_axis[1:]]


@pytest.mark.parametrize(
    ("stored_commit", "this_commit", "why"),
    [
        ({"sha": "b" * 40, "dirty": False}, CLEAN, "not this clean commit"),
        ({"sha": "a" * 40, "dirty": True}, CLEAN, "dirty: True"),
        (CLEAN, {"sha": "a" * 40, "dirty": True}, "not a clean commit"),
    ],
)
def test_results_of_another_tree_are_not_merged(
    tmp_path: Path, stored_commit: dict[str, object], this_commit: dict[str, object], why: str
) -> None:
    stored = _stored(tmp_path, stored_commit, [])
    with pytest.raises(ValueError, match=why):
        scale.merged_from(stored, {"commit": this_commit}, [])


def test_merge_without_a_stored_result_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no .* to merge with"):
        scale.merged_from(tmp_path / "scale.json", {"commit": CLEAN}, [])
    with pytest.raises(SystemExit):  # the command line says it before any round
        scale.main(["--merge", "--out", str(tmp_path), "--clients", "", "--sizes-mb", "10"])
