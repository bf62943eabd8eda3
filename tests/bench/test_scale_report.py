"""bench.scale's grid and report (pure): every point a repeated comparison of FedFaaS, Flower
and SF; medians [min-max], ratios of medians, issue 37's targets met or missed, the shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import scale, scale_report
from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.harness.compare import summarise

GB = 1_000_000_000
RESNET = 4 * rc.RESNET18_VALUES


def test_the_grid_is_20_to_200_clients_and_three_more_sizes_at_20() -> None:
    pts = scale.points()
    assert [p["clients"] for p in pts if p["axis"] == "clients"] == [20, 40, 60, 120, 200]
    assert {p["update_bytes"] for p in pts if p["axis"] == "clients"} == {RESNET}
    sizes = [p for p in pts if p["axis"] == "size"]
    # ResNet-18 at 20 clients is the clients axis' first point, not run twice
    assert [p["update_bytes"] for p in sizes] == [10_000_000, 240_000_000, 1_000_000_000]
    assert {p["clients"] for p in sizes} == {20}
    quick = scale.points(quick=True)
    assert max(p["clients"] for p in quick) <= 4
    assert max(p["update_bytes"] for p in quick) <= 4_000_000
    assert scale.points(clients=(40,), sizes=()) == [
        {"axis": "clients", "clients": 40, "update_bytes": RESNET}
    ]


def _rec(e2e: float, peak: float, cpu: float, floor: float | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "ok": True,
        "e2e_s": e2e,
        "server_s": e2e / 2,
        "cgroup": {"server": {"peak_bytes": peak, "cpu_s": cpu, "threads_ran": 12},
                   "clients": {"peak_bytes": 2 * GB}},
    }  # fmt: skip
    if floor:
        rec["design_floor"] = {"bytes": floor}
    return rec


def _point(n: int, fed_peak: float, flower_peak: float, *, killed: bool = False) -> dict[str, Any]:
    runs = {
        "FedFaaS": [_rec(2.0, fed_peak, 1.0, floor=0.8 * GB), _rec(2.2, fed_peak, 1.2, 0.8 * GB),
                    _rec(1.8, fed_peak, 0.8, 0.8 * GB)],
        "Flower": [_rec(20.0, flower_peak, 6.0)] * 3,
        "SF": [_rec(8.0, 1.5 * GB, 2.5)] * 3,
    }  # fmt: skip
    if killed:
        runs["Flower"] = [
            rw.failure("killed", "over the limit", server_rss_bytes=16.2 * GB, client_rss_bytes=0)
        ] * 3
    return {
        "axis": "clients",
        "clients": n,
        "update_bytes": RESNET,
        "cpus": "0-1",
        "compare": {"by_cpus": {"0-1": {"runs": runs, "summary": summarise(runs)}}},
    }


def _result(pts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "run": {"command": "python -m bench.scale", "commit": {"sha": "abc"}},
        "config": {
            "threads": {"requested": 1},
            "server_mem_limit_bytes": 16 * GB,
            "floor_bytes": 2 * GB,
            "timeout_s": 1200.0,
            "server_cpus": "0-1",
            "repeats": 3,
            "systems": ["FedFaaS", "Flower", "SF"],
            "router_probe": {"mode": "userspace", "reason": "test"},
        },
        "points": pts,
    }


def test_each_row_is_a_median_with_its_range_and_the_ratios_are_of_medians() -> None:
    md = scale_report.render(_result([_point(20, 0.8 * GB, 2.4 * GB)]))
    fed = next(ln for ln in md.splitlines() if ln.startswith("| 20 | 44.8 | FedFaaS |"))
    assert "| 3/3 | 2.00 [1.80-2.20] |" in fed and "| 1.00 [0.80-1.20] |" in fed
    assert "| 0.80 [0.80-0.80]; 1.00 [1.00-1.00] |" in fed  # floor GB; peak / floor
    flower = next(ln for ln in md.splitlines() if ln.startswith("| 20 | 44.8 | Flower |"))
    # 20 / 2.0 (round), 10 / 1.0 (window), 2.4 / 0.8 (peak), 6.0 / 1.0 (CPU-s)
    assert flower.endswith("| 10.00x, 10.00x, 3.00x, 6.00x |")


def test_the_targets_are_met_or_missed_on_the_medians() -> None:
    pts = [_point(20, 0.8 * GB, 2.4 * GB), _point(60, 0.9 * GB, 4.5 * GB),
           _point(120, 0.8 * GB, 9.0 * GB), _point(200, 0.8 * GB, 0, killed=True)]  # fmt: skip
    got = {t["target"]: t for t in scale_report.targets(pts)}
    mem20 = got["server memory at 20 clients >= 3x below Flower"]
    assert mem20["value"] == pytest.approx(3.0) and mem20["met"]
    mem60 = got["server memory at 60 clients >= 8x below Flower"]
    assert mem60["value"] == pytest.approx(5.0) and not mem60["met"]
    assert got["server CPU-seconds at 120 clients >= 5x below Flower"]["met"]
    sf20 = got["server CPU-seconds at 20 clients >= 2x below SF"]
    assert sf20["value"] == pytest.approx(2.5) and sf20["met"]
    flat = got["FedFaaS peak flat from 20 to 200 clients: max/min <= 1.1"]
    assert flat["value"] == pytest.approx(0.9 / 0.8) and not flat["met"]
    assert got["FedFaaS peak <= 1.15x its design floor at 60 clients"]["value"] == pytest.approx(
        0.9 / 0.8
    )
    # a system that did not finish is a miss, never left out
    assert got["server memory at 40 clients below Flower (no target)"]["value"] is None
    md = scale_report.render(_result(pts))
    assert "| server memory at 60 clients >= 8x below Flower | 5.00x | **miss** |" in md
    assert "| 200 | 44.8 | Flower | 0/3 (killed at 16.20 GB" in md


def test_shape_gives_the_peak_growth_and_seconds_per_gb(tmp_path: Path) -> None:
    pts = [_point(20, 0.8 * GB, 2.4 * GB), _point(40, 1.6 * GB, 4.8 * GB)]
    sh = scale_report.shape(pts, "FedFaaS")
    assert sh["peak_growth_over_clients"] == {
        "from_clients": 20,
        "to_clients": 40,
        "peak_ratio": pytest.approx(2.0),
    }
    rates = {x["clients"]: x["s_per_gb"] for x in sh["s_per_gb_received"]}
    assert rates[40] == pytest.approx(2.0 / (40 * RESNET / 1e9))
    res = _result(pts)
    assert "- Flower: peak x2.00 from 20 to 40 clients" in scale_report.render(res)
    scale_report.plot(res, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_a_point_before_its_first_run_is_left_out_of_the_report() -> None:
    pending = {"axis": "clients", "clients": 40, "update_bytes": RESNET}
    md = scale_report.render(_result([_point(20, 0.8 * GB, 2.4 * GB), pending]))
    assert "| 40 | 44.8 |" not in md and "| 20 | 44.8 | SF |" in md


def test_fedfaas_comes_first_in_the_systems_compared() -> None:
    with pytest.raises(SystemExit):
        scale.main(["--systems", "Flower,FedFaaS"])  # FedFaaS is the one compared with


def test_the_size_table_shows_resnet_at_20_clients_once_measured_for_both_axes(
    tmp_path: Path,
) -> None:
    small = dict(_point(20, 0.5 * GB, 1.0 * GB), axis="size", update_bytes=10_000_000)
    res = _result([_point(20, 0.8 * GB, 2.4 * GB), _point(40, 0.8 * GB, 4.8 * GB), small])
    md = scale_report.render(res)
    sizes = md.split("## Against model size")[1].split("## Shape")[0]
    fed = [ln for ln in sizes.splitlines() if "| FedFaaS |" in ln]
    assert [ln.split(" | ")[1] for ln in fed] == ["10.0", "44.8"]  # by size; no 40-client row
    clients = md.split("## Against clients")[1].split("## Against model size")[0]
    assert "| 10.0 |" not in clients
    scale_report.plot(res, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_a_system_stopped_at_every_run_of_a_point_is_left_out_of_larger_ones() -> None:
    killed = _point(120, 0.8 * GB, 0, killed=True)  # Flower: every run over the memory limit
    pts = [_point(60, 0.8 * GB, 4.8 * GB), killed]
    later = {"axis": "clients", "clients": 200, "update_bytes": RESNET}
    gone = scale.left_out(pts, later)
    assert gone == {"Flower": "no run finished at 120 clients x 44.8 MB (killed)"}
    # only larger points of the same axis; an error is not a size's verdict
    assert scale.left_out(pts, {**later, "clients": 100}) == {}
    assert scale.left_out(pts, {"axis": "size", "clients": 20, "update_bytes": 10**9}) == {}
    errored = _point(120, 0.8 * GB, 0)
    errored["compare"]["by_cpus"]["0-1"]["runs"]["SF"] = [rw.failure("error", "boom")] * 3
    runs = errored["compare"]["by_cpus"]["0-1"]["runs"]
    errored["compare"]["by_cpus"]["0-1"]["summary"] = summarise(runs)
    assert scale.left_out([errored], later) == {}
    # once left out, left out of every larger point too
    done = [*pts, {**later, "left_out": gone, "compare": killed["compare"], "cpus": "0-1"}]
    assert scale.left_out(done, {**later, "clients": 400}) == gone
    md = scale_report.render(_result(done))
    assert "- Flower, 200 clients x 44.8 MB: not run, no run finished at 120 clients" in md


def test_each_flower_compared_has_its_own_target_lines() -> None:
    p = _point(20, 0.8 * GB, 2.4 * GB)
    runs = p["compare"]["by_cpus"]["0-1"]["runs"]
    runs = {"FedFaaS": runs["FedFaaS"], "Flower 1.42.0": runs["Flower"],
            "Flower 1.32.1 legacy": [_rec(5.0, 4.0 * GB, 2.0)] * 3, "SF": runs["SF"]}  # fmt: skip
    p["compare"]["by_cpus"]["0-1"] = {"runs": runs, "summary": summarise(runs)}
    got = {t["target"]: t for t in scale_report.targets([p])}
    assert got["server memory at 20 clients >= 3x below Flower 1.42.0"]["met"]
    legacy = got["server memory at 20 clients >= 3x below Flower 1.32.1 legacy"]
    assert legacy["value"] == pytest.approx(5.0) and legacy["met"]
    assert not got["server CPU-seconds at 20 clients >= 5x below Flower 1.32.1 legacy"]["met"]
    # a Flower not measured at a point is a miss there, not a missing line
    assert got["server memory at 60 clients >= 8x below Flower 1.42.0"]["met"] is False
