"""bench-flstore's result merged from several runs (``bench.flstore_merge``): each part keeps
the run it came from, and the Markdown names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.flstore_merge import MergeRefused, main, merge
from bench.flstore_rounds import RESNET18, WORKLOADS


def _run(command: str, sha: str) -> dict[str, Any]:
    return {
        "command": command,
        "started": "2026-11-27T00:20:00+00:00",
        "finished": "2026-11-27T00:30:00+00:00",
        "commit": {"sha": sha, "dirty": False},
    }


def _size(n: int, latency: float) -> dict[str, Any]:
    q = {"latency_s": latency, "latencies_s": [latency, latency]}
    return {
        "updates": n,
        "round_bytes": (n + 1) * RESNET18 * 4,
        "fedfaas": {
            "queries": dict.fromkeys(WORKLOADS, q),
            "memory": {"peak_private_bytes": 7.5e9, "peak_accounted_bytes": 7.2e9},
            "stats": {"queries_in_parts": 0, "queries_streamed": 1},
            "ingest_and_prefetch_s": 60.0,
            "engine_log_tracebacks": 0,
        },
        "objstore-agg": {"queries": dict.fromkeys(WORKLOADS, q)},
        "cache-agg": None,
        "cache_agg_skipped_need_bytes": 20e9,
        "same_answer": dict.fromkeys(WORKLOADS, True),
    }


def _big(*sizes: int, repeats: int = 2) -> dict[str, Any]:
    return {
        "budget_bytes": 8e9,
        "gtg_params": {"method": "gtg", "max_permutations": 5},
        "repeats": repeats,
        "gtg_repeats": 1,
        "memos": "off",
        "platform": "fedfaas up --with all",
        "sizes": {str(n): _size(n, float(n)) for n in sizes},
    }


BASE = {
    "run": _run("python -m bench.flstore --big-rounds ''", "a" * 40),
    "policies": [],
    "overhead": {},
}


def test_big_rounds_from_two_runs_stand_in_one_table_each_naming_its_run() -> None:
    r120 = {
        "run": _run("python -m bench.flstore --big-rounds 120", "b" * 40),
        "big_rounds": _big(120),
    }
    r200 = {
        "run": _run("python -m bench.flstore --big-rounds 200", "b" * 40),
        "big_rounds": _big(200),
    }
    out = merge(BASE, r200, r120)
    assert out["run"] == BASE["run"] and "big_rounds" not in BASE  # nothing changed in place
    sizes = out["big_rounds"]["sizes"]
    assert list(sizes) == ["120", "200"]
    assert sizes["120"]["run"] == r120["run"] and sizes["200"]["run"] == r200["run"]
    from bench.flstore_report import markdown

    md = markdown(out)
    assert "The rows of 120 updates are from their own run: `python -m bench.flstore " in md
    assert "The rows of 200 updates are from their own run: `python -m bench.flstore " in md
    assert "| 120 | multi-krum | 120.0 (120.0-120.0) | 120.0 (120.0-120.0) | not run |" in md
    assert "| 200 | multi-krum | 200.0 (200.0-200.0) |" in md
    # a size run again replaces the older row, the other keeps its run
    again = {
        "run": _run("python -m bench.flstore --big-rounds 200", "c" * 40),
        "big_rounds": _big(200),
    }
    out2 = merge(out, again)
    assert out2["big_rounds"]["sizes"]["200"]["run"]["commit"]["sha"] == "c" * 40
    assert out2["big_rounds"]["sizes"]["120"]["run"] == r120["run"]


def test_parts_that_cannot_stand_in_one_result_are_refused() -> None:
    with_big = merge(BASE, {"run": _run("x", "b" * 40), "big_rounds": _big(120)})
    other = {"run": _run("y", "b" * 40), "big_rounds": _big(200, repeats=3)}
    with pytest.raises(MergeRefused, match="repeats"):
        merge(with_big, other)
    with pytest.raises(MergeRefused, match="latency"):
        merge(BASE, {"run": _run("z", "b" * 40), "latency": {}})


def test_the_merge_writes_the_json_and_renders_the_markdown_from_it(tmp_path: Path) -> None:
    parts = {
        "base": BASE,
        "p200": {
            "run": _run("python -m bench.flstore --big-rounds 200", "b" * 40),
            "big_rounds": _big(200),
        },
    }
    for name, res in parts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "flstore.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    main([str(tmp_path / "base"), str(tmp_path / "p200"), "--out", str(out)])
    stored = json.loads((out / "flstore.json").read_text())
    assert stored["run"] == BASE["run"]  # the base run's times, not stamped again
    assert stored["big_rounds"]["sizes"]["200"]["run"]["command"].endswith("--big-rounds 200")
    md = (out / "flstore.md").read_text()
    assert "The rows of 200 updates are from their own run" in md
    assert (out / "flstore.png").stat().st_size > 0


def _systems(n: int, latency: float, systems: list[str]) -> dict[str, Any]:
    row = _size(n, latency)
    for x in ("fedfaas", "objstore-agg", "cache-agg"):
        if x not in systems:
            row[x] = None
    if "cache-agg" in systems:
        row["cache-agg"] = {"queries": dict.fromkeys(WORKLOADS, {"latency_s": latency})}
        row["cache_agg_skipped_need_bytes"] = None
    if not {"fedfaas", "objstore-agg"} <= set(systems):
        row["same_answer"] = None
    return {**row, "systems": systems, "cache_agg_not_asked": "cache-agg" not in systems}


def test_the_systems_of_one_size_from_two_runs_stand_in_one_row_each_naming_its_run() -> None:
    first = {
        "run": _run("python -m bench.flstore --big-systems fedfaas,objstore-agg", "b" * 40),
        "big_rounds": {
            **_big(),
            "sizes": {"200": _systems(200, 20.0, ["fedfaas", "objstore-agg"])},
        },
    }
    second = {
        "run": _run("python -m bench.flstore --big-systems cache-agg", "c" * 40),
        "big_rounds": {**_big(), "sizes": {"200": _systems(200, 30.0, ["cache-agg"])}},
    }
    row = merge(BASE, first, second)["big_rounds"]["sizes"]["200"]
    assert row["systems"] == ["fedfaas", "objstore-agg", "cache-agg"]
    assert row["fedfaas"]["queries"]["multi-krum"]["latency_s"] == 20.0
    assert row["cache-agg"]["queries"]["multi-krum"]["latency_s"] == 30.0
    assert row["same_answer"] == dict.fromkeys(WORKLOADS, True)  # from the run of both
    assert row["runs"]["fedfaas"] == row["runs"]["objstore-agg"] == first["run"]
    assert row["runs"]["cache-agg"] == second["run"]
    from bench.flstore_report import markdown

    md = markdown(merge(BASE, first, second))
    assert (
        "At 200 updates, FedFaaS and ObjStore-Agg from `python -m bench.flstore --big-systems fedfaas,objstore-agg`"
        in md
    )
    assert "; Cache-Agg from `python -m bench.flstore --big-systems cache-agg`" in md
    assert (
        "| 200 | multi-krum | 20.0 (20.0-20.0) | 20.0 (20.0-20.0) | 30.0 | 1.00x | other runs | True |"
        in md
    )
    # FedFaaS asked again alone: its answers were not compared with ObjStore-Agg's in its run
    again = {
        "run": _run("python -m bench.flstore --big-systems fedfaas", "d" * 40),
        "big_rounds": {**_big(), "sizes": {"200": _systems(200, 10.0, ["fedfaas"])}},
    }
    row2 = merge(BASE, first, second, again)["big_rounds"]["sizes"]["200"]
    assert row2["same_answer"] is None and row2["runs"]["fedfaas"] == again["run"]
    assert row2["runs"]["cache-agg"] == second["run"]
    # a run of all three replaces the row whole
    whole = {
        "run": _run("python -m bench.flstore --big-rounds 200", "e" * 40),
        "big_rounds": _big(200),
    }
    row3 = merge(BASE, first, second, whole)["big_rounds"]["sizes"]["200"]
    assert row3["cache-agg"] is None and row3["run"] == whole["run"]


def test_a_section_of_the_base_can_be_left_out(tmp_path: Path) -> None:
    """A base whose big rounds ran at another budget: refused, unless ``--drop big_rounds``."""
    base = {**BASE, "big_rounds": {**_big(120), "budget_bytes": 8e9}}
    new = {
        "run": _run("python -m bench.flstore --budget-gb 4", "b" * 40),
        "big_rounds": {**_big(200), "budget_bytes": 4e9},
    }
    for name, res in {"base": base, "new": new}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "flstore.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit):
        main([str(tmp_path / "base"), str(tmp_path / "new"), "--out", str(tmp_path / "x")])
    main(
        [
            str(tmp_path / "base"),
            str(tmp_path / "new"),
            "--drop",
            "big_rounds",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    stored = json.loads((tmp_path / "out" / "flstore.json").read_text())
    assert list(stored["big_rounds"]["sizes"]) == ["200"]
    assert stored["big_rounds"]["budget_bytes"] == 4e9


def test_the_big_rounds_own_results_of_two_runs_merge_into_one_each_size_naming_its_run(
    tmp_path: Path,
) -> None:
    parts = {
        "r120": {"run": _run("python -m bench.flstore --big-rounds 120", "a" * 40)},
        "r200": {"run": _run("python -m bench.flstore --big-rounds 200", "b" * 40)},
    }
    parts["r120"]["big_rounds"], parts["r200"]["big_rounds"] = _big(120), _big(200)
    for name, res in parts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "flstore_rounds.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    main(
        [
            str(tmp_path / "r120"),
            str(tmp_path / "r200"),
            "--result",
            "flstore_rounds",
            "--out",
            str(out),
        ]
    )
    stored = json.loads((out / "flstore_rounds.json").read_text())
    assert stored["run"] == parts["r120"]["run"]
    assert sorted(stored["big_rounds"]["sizes"]) == ["120", "200"]
    md = (out / "flstore_rounds.md").read_text()
    assert md.startswith("# FLStore: rounds of 120 and 200 ResNet-18-sized updates")
    assert "python -m bench.flstore --big-rounds 120" in md  # the head: the base's run
    assert "The rows of 200 updates are from their own run" in md
    assert "| 120 | shapley | 120.0 (120.0-120.0) |" in md
    assert (out / "flstore_rounds.png").stat().st_size > 0
    assert not (out / "flstore.json").exists()


def test_fedfaas_asked_again_alone_is_compared_with_neither_baseline_of_the_earlier_run() -> None:
    """At 120 updates FedFaaS was asked again after a fix (issue 36): the stored row had kept
    'equal to Cache-Agg's: True' from the earlier run's FedFaaS, whose answers were compared."""
    both = _systems(120, 40.0, ["fedfaas", "objstore-agg", "cache-agg"])
    both["same_answer_cache_agg"] = dict.fromkeys(WORKLOADS, True)
    first = {"run": _run("python -m bench.flstore --big-rounds 120", "b" * 40)}
    first["big_rounds"] = {**_big(), "sizes": {"120": both}}
    again = {
        "run": _run("python -m bench.flstore --big-systems fedfaas", "d" * 40),
        "big_rounds": {**_big(), "sizes": {"120": _systems(120, 10.0, ["fedfaas"])}},
    }
    assert merge(BASE, first)["big_rounds"]["sizes"]["120"]["same_answer_cache_agg"]
    row = merge(BASE, first, again)["big_rounds"]["sizes"]["120"]
    assert row["same_answer"] is None and row["same_answer_cache_agg"] is None
    assert row["runs"]["fedfaas"] == again["run"] and row["runs"]["cache-agg"] == first["run"]
    from bench.flstore_rounds_report import markdown as rounds_md

    md = "\n".join(rounds_md(merge(BASE, first, again)["big_rounds"]))
    # latencies of two sittings are not one comparison: no ratio, no verdict
    assert (
        "| 120 | multi-krum | 10.0 (10.0-10.0) | 40.0 (40.0-40.0) | 40.0 | other runs | other "
        "runs | not compared | not compared |" in md
    )
