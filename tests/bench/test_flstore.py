"""bench.flstore (and its report, bench.flstore_report): the 'load included' figures and the Markdown rendered from a result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.flstore import MEMO_METHOD, _one
from bench.flstore_micro import handoff
from bench.flstore_plan import POLICIES
from bench.flstore_report import handoff_md, markdown, steady_md, with_load
from bench.runinfo import run_info


def _row(fed: float, obj: float, cache: float) -> dict[str, Any]:
    return {
        "workload": "multi-krum",
        "fedfaas": {"latency_s": fed, "hit": True, "loaded": 0},
        "objstore-agg": {"latency_s": obj},
        "cache-agg": {"latency_s": cache},
        "same_result": True,
    }


def _mode(memo: str) -> dict[str, Any]:
    mode: dict[str, Any] = {
        "memo": memo,
        "method": MEMO_METHOD[memo],
        "redis_parser": "hiredis",
        "function_env": {"OMP_NUM_THREADS": "1", "FEDFAAS_FLSTORE_GRAM_MEMO": "1"},
        "cache_functions": {"flstore-cache-0": {"gram_memo": memo == "on", "gram_pairs": 6}},
        "baselines": {"cache-agg": {"gram_memo": memo == "on", "gram_pairs": 6}},
        "cache_agg_mirror_s": 2.0,
        "cache_agg_mirrored_objects": 12,
        "loads": [{"job": "bench", "round": 1, "load_s": 3.0}],
        "load_s": 3.0,
        "prefetch_after_queries_s": 1.0,
        "queries": [_row(0.5, 2.0, 1.0), _row(0.5, 2.0, 1.0)],
        "summary": {
            "multi-krum": {
                "queries": 2,
                "hits": 2,
                "objects_loaded": 0,
                "mean_s": {"fedfaas": 0.5, "objstore-agg": 2.0, "cache-agg": 1.0},
                "reduction_vs_objstore": 0.75,
                "reduction_vs_cache": 0.5,
                "same_result": True,
                "baseline_threads": 1,
            }
        },
    }
    mode["with_load"] = with_load(mode)
    return mode


def test_load_prefetch_and_mirror_are_charged_to_the_queries_of_the_system_that_paid_them() -> None:
    w = _mode("on")["with_load"]
    assert w["queries"] == 2
    assert w["outside_queries_s"] == {"fedfaas": 4.0, "objstore-agg": 0.0, "cache-agg": 2.0}
    assert w["mean_s"] == {"fedfaas": 2.5, "objstore-agg": 2.0, "cache-agg": 2.0}
    assert w["reduction_vs_objstore"] == pytest.approx(-0.25)
    assert w["reduction_vs_cache"] == pytest.approx(-0.25)


def test_every_latency_row_names_its_memo_method_and_load_has_rows_of_its_own() -> None:
    res = {
        "run": run_info("bench.flstore", ["--quick"]),
        "latency": {
            "model": "small CNN",
            "floats_per_model": 10,
            "model_mb": 0.0,
            "rounds": 1,
            "clients_per_round": 2,
            "pool": 250,
            "secondaries": 1,
            "modes": {"on": _mode("on"), "off": _mode("off")},
        },
        "policies": [
            {"trace": "t", "policy": p, "hit_rate": 0.5, "requests": 4, "note": "n"}
            for p in POLICIES
        ],
        "overhead": {},
    }
    md = markdown(res)
    rows = [ln for ln in md.splitlines() if ln.startswith("| memo ")]
    assert len(rows) == 2 * 5  # per mode: one workload, three load rows, 'all, load included'
    assert sum(r.startswith("| memo on |") for r in rows) == 5
    assert MEMO_METHOD["on"] in md and MEMO_METHOD["off"] in md
    assert "| memo off | **all, load included**" in md
    assert "round load + prefetch" in md and "mirror of the jobs into Redis" in md
    assert "| 2.500 | 2.000 | 2.000 | +25.0% | +25.0% |" in md  # the load-included figures
    assert "Cache-Agg's Redis reply parser: hiredis" in md
    assert "flstore-cache-0 off (6 pairs)" in md
    assert "| +75.0% | +50.0% | True |  | 1 |" not in md  # reductions print as signed changes
    assert "| -75.0% | -50.0% | True |  | 1 |" in md  # no reference column here; threads
    assert "cache functions run with OMP_NUM_THREADS=1." in md


@pytest.mark.slow  # over 5 s: `make test-slow`
@pytest.mark.integration
def test_the_handoff_section_maps_every_update_in_place_and_times_both_paths(
    tmp_path: Path,
) -> None:
    """The section really takes the handoff path (a silent fallback to MinIO would time MinIO
    twice): every update of the shm job is mapped in place, none of the MinIO job's."""
    hd = handoff(tmp_path, rounds=2, clients=3, small=True)
    assert [(x["round"], x["path"]) for x in hd["rows"]] == [
        (1, "shm"),
        (1, "minio"),
        (2, "shm"),
        (2, "minio"),
    ]
    assert all(x["seconds"] > 0 for x in hd["rows"])
    assert hd["handed_off"] == 2 * 3
    assert sum(f["mapped_in_place"] for f in hd["functions"].values()) == 2 * 3
    md = "\n".join(handoff_md(hd))
    assert "| shm (mapped in place) | 2 |" in md and "| MinIO (read + decode) | 2 |" in md


def test_the_steady_state_rows_print_each_small_query_against_cache_agg() -> None:
    steady = {
        "evaluate": {
            "queries": 20,
            "mean_s": {"fedfaas": 0.006, "objstore-agg": 0.02, "cache-agg": 0.005},
            "median_s": {"fedfaas": 0.004, "objstore-agg": 0.02, "cache-agg": 0.005},
            "reduction_vs_cache": 1 - 0.006 / 0.005,
            "diff_vs_cache_s": 0.001,
            "diff_vs_cache_ci95_s": [-0.0005, 0.0025],
            "plans_kept": 19,
            "same_result": True,
        }
    }
    md = "\n".join(steady_md("memo on", steady))
    assert "each asked 20 times of each system, the system that goes first rotating" in md
    # slower than Cache-Agg prints as a positive change, as in the live rows, and the paired
    # difference with its interval
    assert (
        "| evaluate | 20 | 6.00 | 4.00 | 19 | 20.00 | 5.00 | 5.00 | +20.0% | "
        "+1.00 (-0.50 to +2.50) | True |"
    ) in md


class _Answer:
    def __init__(self, body: dict[str, Any]) -> None:
        self.status_code, self._body = 200, body

    def json(self) -> dict[str, Any]:
        return self._body


class _Calls:
    """A client and a stack in one, logging what ``_one`` does in order (the logic of the
    turns only; the integration runs of the bench ask the real systems)."""

    tracker_url, auth = "http://tracker", {"Authorization": "Bearer t"}

    def __init__(self) -> None:
        self.log: list[str] = []

    def wait_idle(self, timeout: float) -> None:
        self.log.append("idle")

    def post(self, url: str, json: Any, headers: Any) -> _Answer:
        system = url.split("/")[2]
        self.log.append(system)
        extra = {"fetch_s": 0.0, "decode_s": 0.0} if system != "tracker" else {}
        return _Answer({"result": {"x": 1.0}, **extra})


@pytest.mark.parametrize(
    ("first", "order"),
    [
        (0, ["tracker", "objstore", "cache"]),
        (1, ["objstore", "cache", "tracker"]),
        (5, ["cache", "tracker", "objstore"]),
    ],
)
def test_each_query_rotates_which_system_asks_first_and_each_asks_on_an_idle_engine(
    first: int, order: list[str]
) -> None:
    calls = _Calls()
    urls = {"objstore-agg": "http://objstore", "cache-agg": "http://cache"}
    row = _one(
        calls,  # type: ignore[arg-type]
        calls,  # type: ignore[arg-type]
        urls,
        "oort",
        {"workload": "oort"},
        first=first,
        quiet=True,
    )
    assert calls.log == [order[0], "idle", order[1], "idle", order[2]]
    names = {"tracker": "fedfaas", "objstore": "objstore-agg", "cache": "cache-agg"}
    assert row["order"] == [names[x] for x in order]
    assert row["same_result"] is True
    assert row["settle_s"] >= 0


def test_the_reference_column_counts_the_queries_checked_and_those_that_differ() -> None:
    from bench.flstore_report import _reference_cell, _reference_count

    rows = [{"reference": []}, {"reference": ["scores"]}, {"reference": None}, {}]
    count = _reference_count(rows)
    assert count == {"checked": 2, "differ": 1}
    assert _reference_cell(count) == "**1 of 2 differ**"
    assert _reference_cell({"checked": 2, "differ": 0}) == "2/2"
    assert _reference_cell({"checked": 0, "differ": 0}) == ""  # no reference for the workload
    assert _reference_cell(None) == ""  # a result stored before the reference was wired
