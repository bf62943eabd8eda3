"""bench.dataplane's report: the same-CPUs comparison's rows, the micro-benchmarks, and the round
variants as medians [min-max] over repeated runs with their ratios to the default round; the
table head describes the SF round compared with; a variant's failed runs are counted, not
dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import dataplane_report as report
from bench.harness import round_window as rw
from bench.harness.compare import summarise


def _rec(e2e: float, **kw: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "router": "ebpf",
        "update_bytes": 44_764_968,
        "aggregator_replicas": 1,
        "endpoints_per_replica": 2,
        "e2e_s": e2e,
        "server_s": e2e * 0.75,
        "last_update_to_published_s": 0.25,
        "act_over_ingest": 1.4 / 1.2,
        "cgroup": {"server": {"peak_bytes": 800_000_000, "cpu_s": 1.0, "threads_ran": 12},
                   "clients": {"peak_bytes": 2_000_000_000}},
        **kw,
    }  # fmt: skip


def _sf(e2e: float) -> dict[str, Any]:
    return _rec(e2e, leaves=10, fanout=2, leaf_servers=2)


def _cmp(runs: dict[str, list[dict[str, Any]]], cpus: str = "0-1") -> dict[str, Any]:
    return {
        "systems": list(runs),
        "repeats": 3,
        "order": "interleaved: " + ", ".join(runs) + ", then again",
        "by_cpus": {cpus: {"runs": runs, "summary": summarise(runs)}},
    }


def _res() -> dict[str, Any]:
    compare = _cmp(
        {
            "FedFaaS": [_rec(2.0), _rec(1.8), _rec(2.2)],
            "Flower": [_rec(20.0)] * 3,
            "SF": [_sf(8.0)] * 3,
        }
    )
    lean_failed = rw.failure("timeout", "no model")
    variants = _cmp(
        {
            "FedFaaS": [_rec(2.0), _rec(1.8), _rec(2.2)],
            "FedFaaS, userspace router": [_rec(3.0, router="userspace")] * 3,
            "FedFaaS, lean": [_rec(4.0), _rec(5.0), lean_failed],
        }
    )
    return {
        "machine": {"cores": 2, "memory_bytes": 2**34, "python": "3.11", "kernel": "6"},
        "threads": {"env": {"OMP_NUM_THREADS": "1"}, "pools": []},
        "compare": compare,
        "variants": variants,
        "ingest": {"update_bytes": 44_764_968, "reps": 8, "fedfaas_gbps": 2.0,
                   "fedfaas_best_gbps": 2.5, "tcp_gbps": 4.0, "starlette_gbps": 0.5},
        "aggregation": {"updates": 8, "numpy_gbps": 6.0, "torch_gbps": 5.0,
                        "plain_add_gbps": 7.0, "flower_gbps": 1.0},
    }  # fmt: skip


def test_the_comparison_rows_give_medians_ranges_and_ratios_of_medians() -> None:
    md = report.render(_res())
    row = next(ln for ln in md.splitlines() if ln.startswith("| round e2e"))
    assert "| 2.00 [1.80-2.20] |" in row and "Flower 20.00 [20.00-20.00]" in row
    assert "10.00x faster than Flower" in row and "4.00x faster than SF" in row


def test_each_variant_is_a_median_over_its_runs_with_its_ratio_to_the_default() -> None:
    rows = report.variant_rows(_res()["variants"])
    assert rows[0].startswith("Round variants, FedFaaS alone, on CPUs 0-1: 3 runs each")
    user = next(r for r in rows if r.startswith("| FedFaaS, userspace router |"))
    assert "(userspace router) | 3/3 | 3.00 [3.00-3.00] | 2.25 [2.25-2.25] |" in user
    assert user.endswith("| 1.50x; 1.50x |")  # 3.0 / 2.0 and 2.25 / 1.5
    lean = next(r for r in rows if r.startswith("| FedFaaS, lean |"))
    # the timed-out run counts as run, not finished; the medians are over the two that did
    assert "| 2/3 | 4.50 [4.00-5.00] |" in lean and lean.endswith("| 2.25x; 2.25x |")
    default = next(r for r in rows if r.startswith("| FedFaaS |"))
    assert "| 0.250 [0.250-0.250] | 1.17 [1.17-1.17] |" in default  # tail, ACT / ingest


def test_the_table_head_describes_the_sf_round_it_compares_with() -> None:
    md = report.render(_res())
    assert "SF round (HTTP between aggregators): 10 leaves (I=2) on 2 uvicorn+Starlette" in md
    assert "1 warm `aggregator` replica(s) of 2 endpoint(s)" in md


def test_the_micro_benchmarks_keep_their_rows() -> None:
    md = report.render(_res())
    assert "| ingest 44.8 MB over loopback HTTP" in md and "4.0x Starlette, 50% of TCP" in md
    assert "| FedAvg fold, 1 core" in md and "6.0x / 5.0x Flower" in md


def test_the_plot_is_drawn_from_the_medians(tmp_path: Path) -> None:
    report.plot(_res(), tmp_path / "dataplane.png")
    assert (tmp_path / "dataplane.png").stat().st_size > 0
    # a comparison alone (--compare-only) has no plot
    res = _res()
    del res["ingest"]
    report.plot(res, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
