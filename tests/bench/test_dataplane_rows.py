"""bench.dataplane's round rows: each comparison names its window and method, gives both
baselines (Flower, SF) with FedFaaS's ratio against each, and a failed side shows what stopped
it."""

from __future__ import annotations

from typing import Any

from bench import dataplane_report as report
from bench.harness import round_window as rw


def _round(router: str) -> dict[str, Any]:
    return {
        "ok": True,
        "fanout": 2,
        "max_inflight": 4,
        "router": router,
        "clients": 20,
        "update_bytes": 44_764_968,
        "e2e_s": 2.0,
        "server_s": 1.5,
        "server_gateway_mark_s": 1.49,
        "server_peak_bytes": 1_000_000_000,
        "server_hwm_bytes": 1_500_000_000,
        "server_processes": 4,
        "act_s": 1.4,
        "ingest_s": 1.2,
        "after_ingest_s": 0.2,
        "last_update_to_published_s": 0.25,
        "act_over_ingest": 1.4 / 1.2,
    }


def _flower() -> dict[str, Any]:
    return {
        "ok": True,
        "num_clients": 20,
        "e2e_s": 8.0,
        "server_s": 6.0,
        "server_peak_bytes": 5_000_000_000,
        "server_hwm_bytes": 5_100_000_000,
    }


def _sf() -> dict[str, Any]:
    return {
        "ok": True,
        "fanout": 2,
        "leaves": 10,
        "leaf_servers": 2,
        "clients": 20,
        "update_bytes": 44_764_968,
        "e2e_s": 3.0,
        "server_s": 2.4,
        "server_peak_bytes": 2_000_000_000,
        "server_hwm_bytes": 2_200_000_000,
        "server_processes": 3,
    }


def _res(flower: dict[str, Any] | None, sf: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "threads": {"env": {"OMP_NUM_THREADS": "1"}, "pools": []},
        "round": _round("ebpf"),
        "round_userspace": _round("userspace"),
        "flower": flower,
        "round_sf": sf,
    }


def test_every_round_row_names_its_window_and_compares_like_with_like() -> None:
    rows = report.round_rows(_res(_flower()))
    e2e = [r for r in rows if "weights in client memory -> global model available" in r]
    server = [r for r in rows if "server-side window only" in r]
    mem = [r for r in rows if "every page counted once" in r]
    assert len(e2e) == len(server) == len(mem) == 2  # eBPF and userspace rounds
    assert "| 2.00 | Flower 8.00; SF (not run) | 4.0x faster than Flower |" in e2e[0]
    assert "clients serialise inside the window" in e2e[0]
    assert "| 1.50 (gateway's own mark 1.49) | Flower 6.00; SF (not run) | 4.0x faster" in server[0]
    assert "| 1.00 (1.50) | Flower 5.00; SF (not run) | 5.0x less than Flower |" in mem[0]
    assert all("env 1 in every process" in r for r in e2e + server + mem)


def test_every_round_row_gives_the_sf_figure_and_the_ratio_against_it() -> None:
    rows = report.round_rows(_res(_flower(), _sf()))
    e2e = next(r for r in rows if "weights in client memory" in r)
    server = next(r for r in rows if "server-side window only" in r)
    mem = next(r for r in rows if "every page counted once" in r)
    assert "| Flower 8.00; SF 3.00 | 4.0x faster than Flower; 1.5x faster than SF |" in e2e
    assert "| Flower 6.00; SF 2.40 | 4.0x faster than Flower; 1.6x faster than SF |" in server
    assert "SF: the earliest of its leaf servers' ports" in server
    assert "| Flower 5.00; SF 2.00 | 5.0x less than Flower; 2.0x less than SF |" in mem
    assert "SF: its leaf servers and top" in mem


def test_the_table_head_describes_the_sf_round_it_compares_with() -> None:
    res = {
        **_res(_flower(), _sf()),
        "machine": {"cores": 2, "memory_bytes": 2**34, "python": "3.12"},
        "ingest": {
            "update_bytes": 44_764_968,
            "reps": 2,
            "fedfaas_gbps": 2.0,
            "fedfaas_best_gbps": 2.1,
            "tcp_gbps": 4.0,
            "starlette_gbps": 1.0,
        },
        "aggregation": {
            "updates": 3,
            "numpy_gbps": 5.0,
            "torch_gbps": 5.0,
            "plain_add_gbps": 4.0,
            "flower_gbps": 1.0,
        },
    }
    head = report.table(res).split("\n\n")[0]
    assert "SF round (HTTP between aggregators): 10 leaves (I=2) on 2" in head


def test_a_killed_flower_point_shows_its_size_not_a_ratio() -> None:
    killed = rw.failure("killed", "over", server_rss_bytes=16_000_000_000)
    rows = report.round_rows(_res(killed))
    e2e = next(r for r in rows if "weights in client memory" in r)
    assert "Flower killed at 16.00 GB; SF (not run) |  |" in e2e


def test_a_killed_sf_point_shows_its_size_and_flower_keeps_its_ratio() -> None:
    killed = rw.failure("killed", "over", server_rss_bytes=9_000_000_000)
    rows = report.round_rows(_res(_flower(), killed))
    e2e = next(r for r in rows if "weights in client memory" in r)
    assert "| Flower 8.00; SF killed at 9.00 GB | 4.0x faster than Flower |" in e2e


def test_a_result_stored_before_the_sf_round_existed_renders_it_as_not_run() -> None:
    old = {"ran": False, "reason": "not run: no HTTP hand-off mode"}
    rows = report.round_rows(_res(None, old))
    assert any("Flower (not run); SF (not run) |  |" in r for r in rows)
    assert not any("not run: no HTTP hand-off mode" in r for r in rows)


def test_the_tail_row_gives_last_update_to_published_and_to_sealed() -> None:
    rows = report.round_rows(_res(_flower()))
    tail = [r for r in rows if "the tail, last update sealed -> global model published" in r]
    assert len(tail) == 2 and "| 0.250 (0.200) |" in tail[0]


def test_the_memory_sweep_says_how_flat_and_how_far_below_flower() -> None:
    res = _res(_flower())
    res["memory_sweep"] = {
        "20": _round("ebpf"),
        "200": {**_round("ebpf"), "clients": 200, "server_peak_bytes": 1_050_000_000},
        "60": rw.failure("killed", "over", server_rss_bytes=3_000_000_000),
    }
    rows = report.round_rows(res)
    sweep = next(r for r in rows if r.startswith("| memory sweep (default round settings"))
    assert "20: 1.00; 60: killed at 3.00 GB; 200: 1.05 |" in sweep
    assert "Flower at 20 clients 5.00: 4.76x FedFaaS's at 200" in sweep
    assert "max/min 1.05 |" in sweep


def test_a_result_stored_before_the_counted_once_peak_renders_its_vmhwm() -> None:
    old = {k: v for k, v in _round("ebpf").items() if k != "server_peak_bytes"}
    rows = report.round_rows({**_res(_flower()), "round": old})
    mem = next(r for r in rows if "every page counted once" in r)
    assert "| 1.50 (1.50) |" in mem


def test_a_round_measured_by_cgroup_shows_the_cgroup_peak_and_the_sampled_one_beside() -> None:
    rnd = dict(
        _round("ebpf"),
        cgroup={"server": {"peak_bytes": 800_000_000}},
        server_peak_sample_hz=40.4,
    )
    flower = dict(_flower(), cgroup={"server": {"peak_bytes": 4_000_000_000}})
    rows = report.round_rows({**_res(flower), "round": rnd})
    mem = next(r for r in rows if "every page counted once" in r)
    # the cgroup peaks compared (4.0 / 0.8), the sampled 1.00 GB at its rate in brackets
    assert (
        "| 0.80 (sampled 1.00 at 40/s) | Flower 4.00; SF (not run) | 5.0x less than Flower |" in mem
    )
    assert "memory.max_usage_in_bytes" in mem
