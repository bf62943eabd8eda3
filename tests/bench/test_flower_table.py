"""bench.flower_baseline's table: the server's and clients' cgroup figures when the round was
measured by cgroup, none for a result stored before that."""

from __future__ import annotations

from typing import Any

from bench import flower_baseline, flower_report


def _res(**more: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "flwr_version": "1.32.1",
        "num_clients": 3,
        "update_bytes": 1_000_000,
        "num_tensors": 102,
        "e2e_s": 0.3,
        "server_s": 0.2,
        "ingest_s": 0.2,
        "aggregate_s": 0.1,
        "round_s": 0.4,
        "server_hwm_bytes": 90_000_000,
        "server_idle_rss_bytes": 77_000_000,
        **more,
    }


def test_the_table_gives_the_cgroup_figures_when_measured() -> None:
    cg = {
        "server": {
            "cpus": "0",
            "peak_bytes": 56e6,
            "cpu_s": 0.17,
            "threads_ran": 19,
            "threads_max": 17,
        },
        "clients": {"peak_bytes": 246e6},
    }
    table = flower_report.table(_res(cgroup=cg))
    assert "| server cgroup peak memory (CPUs 0) | 56 MB |" in table
    assert "| server cgroup CPU-seconds in the round | 0.17 s |" in table
    assert "| server threads that ran (most at once) | 19 (17) |" in table
    assert "| clients' cgroup peak memory | 246 MB |" in table
    assert "cgroup" not in flower_report.table(_res())


def test_the_server_window_is_split_at_the_servers_last_fruitful_pull() -> None:
    """Flower 1.42's ServerApp polls the SuperLink: the pull that brought the last replies
    began ``poll_wait_s`` after every update's bytes were in, and took ``last_pull_s``."""
    s = 1_000_000_000
    pulls = [[0, s // 10, 0], [3 * s, 3 * s + s // 10, 12], [6 * s, 8 * s, 8]]
    split = flower_baseline._pull_split(pulls, all_bytes_ns=5 * s)
    assert split == {"last_pull_s": 2.0, "poll_wait_s": 1.0, "pulls": 3}
    assert flower_baseline._pull_split([[0, 1, 0]], 5)["last_pull_s"] is None
    table = flower_report.table(_res(**split))
    assert "| the ServerApp's wait for its next poll" in table.replace("|   ", "| ")
    assert "| 1.00 s |" in table and "| 2.00 s |" in table
