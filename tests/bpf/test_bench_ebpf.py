"""The eBPF benchmark's pure parts (the full run is ``make bench-ebpf``, marked slow here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import ebpf as bench
from bench import ebpf_report


def test_summary_reports_median_p99_and_cpu_per_handoff() -> None:
    lat_ns = [1_000 * i for i in range(1, 101)]  # 1..100 us
    s = bench._summary(lat_ns, cpu_s=0.002, n=100)
    assert s["median_us"] == 50.5 and s["p99_us"] == 99.0 and s["mean_us"] == 50.5
    assert s["cpu_us_per_handoff"] == pytest.approx(20.0)


def _fake_report() -> dict[str, object]:
    row = {
        "n": 10,
        "median_us": 20.0,
        "p99_us": 30.0,
        "mean_us": 21.0,
        "cpu_us_per_handoff": 50.0,
        "key_median_us": 12.0,
        "open_median_us": 8.0,
        "open_p99_us": 9.0,
        "top_threads": 1,
        "arena_maps": 1,
        "first_touch_us": 900.0,
        "last_touch_us": 90.0,
    }
    slow = row | {"median_us": 20_000.0, "cpu_us_per_handoff": 9_000.0}
    results = {
        m: {
            "ebpf": row,
            "ebpf_file": row | {"median_us": 2_000.0, "open_median_us": 1_990.0},
            "userspace": row | {"median_us": 40.0},
            "sf": slow,
            "sl": slow,
            "bytes": 4 * p,
        }
        for m, p in bench.MODELS.items()
    }
    ratios = {
        m: {
            "ebpf_file_over_ebpf_latency": 100.0,
            "ebpf_file_over_ebpf_cpu": 50.0,
            "userspace_over_ebpf_latency": 2.0,
            "sf_over_ebpf_latency": 1000.0,
            "sl_over_ebpf_latency": 1000.0,
            "userspace_over_ebpf_cpu": 1.0,
            "sf_over_ebpf_cpu": 180.0,
            "sl_over_ebpf_cpu": 180.0,
        }
        for m in bench.MODELS
    }
    targets = {
        "ebpf_key_median_le_50us": True,
        "ebpf_key_median_le_20us": True,
        "ebpf_key_p99_le_100us": False,
        "ebpf_one_mapping_per_grant": True,
        "ebpf_key_flat_max_over_min": 1.0,
        "ebpf_open_max_over_min": 3.0,
        "sf_over_ebpf_resnet152_ge_100": True,
        "ebpf_cpu_lt_userspace": False,
    }
    return {
        "run": {
            "command": "python -m bench.ebpf",
            "started": "2026-11-23T21:00:00+00:00",
            "finished": "2026-11-23T21:05:00+00:00",
            "commit": {"sha": "0123456789abcdef", "dirty": False},
            "machine": {"cores": 2, "memory_gib": 23.5, "kernel": "6.18", "python": "3.11"},
        },
        "config": {"key_handoffs": 10, "bulk_handoffs": {"sf": {"a": 3}, "sl": {"a": 2}}},
        "results": results,
        "ratios": ratios,
        "targets": targets,
    }


def test_markdown_table_has_a_row_per_model_and_method_with_ratios() -> None:
    md = ebpf_report.markdown(_fake_report())  # type: ignore[arg-type]
    rows = [line for line in md.splitlines() if line.startswith("| resnet")]
    assert len(rows) == len(bench.MODELS) * len(ebpf_report.METHODS)
    assert "| resnet152 | 240.8 | sf | 20,000 |" in md and "| 1,000x | 180.0x |" in md
    assert "eBPF CPU < userspace CPU: **False**" in md
    assert "median <= 20 us: **True**" in md and "p99 <= 100 us: **False**" in md
    assert "| resnet18 | 46.8 | ebpf_file | 2,000 |" in md and "| 900.0 / 90.0 |" in md
    assert "commit 0123456789ab" in md


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "ebpf.png"
    ebpf_report.plot(_fake_report(), out)  # type: ignore[arg-type]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.integration
def test_quick_benchmark_run_measures_every_method(tmp_path: Path) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    import json

    report = json.loads((tmp_path / "ebpf.json").read_text())
    for res in report["results"].values():
        assert res["sf"]["n"] > 0 and res["sl"]["n"] > 0
        assert res["userspace"]["n"] > 0 and res["ebpf_file"]["n"] > 0
        assert res["userspace"]["arena_maps"] == 1  # mapped at the grant, never per handoff
