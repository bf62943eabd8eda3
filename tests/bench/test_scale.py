"""bench.harness.round_window (bench.scale's rounds): the window bookkeeping, failure records, the
memory guard's decision (pure), and the watchers on real processes and sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.harness import round_clients as rc
from bench.harness import round_window as rw

GB = 1_000_000_000


# ----------------------------------------------------------------------------- window
def test_window_runs_from_the_earliest_start_mark_to_the_end() -> None:
    assert rw.window_s([3_000_000_000, 1_000_000_000, 2_000_000_000], 4_500_000_000) == 3.5


@pytest.mark.parametrize(
    ("starts", "end", "why"),
    [
        ([], 10, "no start marks"),
        ([0, 5], 10, "missing mark"),
        ([5], 0, "missing mark"),
        ([20, 30], 10, "before the first start"),
    ],
)
def test_window_refuses_marks_that_cannot_be_one_round(
    starts: list[int], end: int, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        rw.window_s(starts, end)


# ----------------------------------------------------------------------------- failures
def test_a_failure_is_a_record_carrying_its_sizes() -> None:
    rec = rw.failure("killed", "server RSS over", server_rss_bytes=12_340_000_000, clients=20)
    assert rec == {
        "ok": False,
        "failure": "killed",
        "detail": "server RSS over",
        "server_rss_bytes": 12_340_000_000,
        "clients": 20,
    }
    assert rw.killed_at(rec) == "killed at 12.34 GB"
    low = rw.failure(
        "killed", "floor", cause="floor", server_rss_bytes=3 * 10**8, client_rss_bytes=19 * GB
    )
    assert rw.killed_at(low) == "killed: machine low, server 0.30 GB, clients 19.00 GB"
    oom = rw.failure("killed", "oom", cause="sigkill", server_rss_bytes=GB, client_rss_bytes=0)
    assert rw.killed_at(oom) == "killed by SIGKILL, server 1.00 GB, clients 0.00 GB"
    assert rw.killed_at(rw.failure("timeout", "no model")) == "timeout"
    assert rw.killed_at({"ok": True, "e2e_s": 1.0}) == ""
    with pytest.raises(ValueError, match="unknown failure kind"):
        rw.failure("oom", "?")


# ----------------------------------------------------------------------------- guard decision
def test_guard_stops_a_point_whose_server_passes_the_limit() -> None:
    why = rw.guard_decision(17 * GB, 10 * GB, limit_bytes=16 * GB, floor_bytes=2 * GB)
    assert why is not None and "over the limit 16.00 GB" in why


def test_guard_stops_a_point_when_the_machine_runs_low() -> None:
    why = rw.guard_decision(1 * GB, GB // 2, limit_bytes=16 * GB, floor_bytes=2 * GB)
    assert why is not None and "under the floor 2.00 GB" in why


def test_guard_lets_a_point_run_within_both_bounds_and_zero_means_no_limit() -> None:
    assert rw.guard_decision(15 * GB, 3 * GB, limit_bytes=16 * GB, floor_bytes=2 * GB) is None
    assert rw.guard_decision(500 * GB, 3 * GB, limit_bytes=0, floor_bytes=2 * GB) is None


def test_memory_guard_kills_once_and_records_the_sizes_it_saw() -> None:
    kills: list[int] = []
    guard = rw.MemoryGuard(
        lambda: [os.getpid()], lambda: kills.append(1), limit_bytes=1, period=0.01
    )
    guard.start()
    guard.join(10)
    assert kills == [1]
    rec = guard.failure(clients=4)
    assert rec["failure"] == "killed" and rec["clients"] == 4
    assert rec["server_rss_bytes"] > 1 and rec["available_bytes"] > 0
    assert "over the limit" in rec["detail"] and rec["cause"] == "limit"


def test_memory_guard_trips_on_the_machine_floor() -> None:
    kills: list[int] = []
    guard = rw.MemoryGuard(
        lambda: [os.getpid()], lambda: kills.append(1), floor_bytes=1 << 60, period=0.01
    )
    guard.start()
    guard.join(10)
    assert kills == [1] and guard.tripped is not None
    assert "under the floor" in guard.tripped["reason"] and guard.tripped["cause"] == "floor"
    assert rw.killed_at(guard.failure()).startswith("killed: machine low, server ")


# ----------------------------------------------------------------------------- /proc, sockets
def test_summed_hwm_covers_a_process_and_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in rw.tree([os.getpid()])
        hwm = rw.summed_hwm([os.getpid()])
        assert set(hwm["per_process"]) >= {os.getpid(), child.pid}
        assert hwm["bytes"] == sum(hwm["per_process"].values())
        assert hwm["per_process"][os.getpid()] >= rw.status_bytes(os.getpid(), "VmRSS")
    finally:
        child.kill()
        child.wait()


def test_first_bytes_sees_an_upload_arrive_on_the_server_port() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    try:
        first = rw.FirstBytes(port, threshold=64 << 10)
        first.start()
        cli.sendall(b"h" * 1000)  # a request head: under the threshold
        assert first.received() < first.threshold and first.t_ns == 0
        sender = threading.Thread(target=cli.sendall, args=(b"x" * (256 << 10),))
        sender.start()
        got = 0
        while got < 1000 + (256 << 10):
            got += len(conn.recv(1 << 20))
        sender.join()
        first.join(10)
        assert first.t_ns > 0
        assert rw.tcp_bytes_received(port)  # the accepted socket, seen by the kernel counters
        # a round that ended before the poll saw the bytes (within the poll's lag) has a zero
        # server window, not a negative one or an error; a later end is measured from the mark
        assert first.server_window_s(first.t_ns - 1_000_000) == 0.0
        assert first.server_window_s(first.t_ns + 2_000_000_000) == pytest.approx(2.0)
    finally:
        for s in (cli, conn, srv):
            s.close()


def test_first_bytes_never_seen_gives_no_server_window() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        first = rw.FirstBytes(srv.getsockname()[1])
        assert first.server_window_s(12345) is None
    finally:
        srv.close()


# ----------------------------------------------------------------------------- the model
def test_scaled_layout_keeps_names_and_count_and_hits_the_size() -> None:
    base = rc.resnet18_layout()
    assert rc.layout_bytes(base) == 4 * rc.RESNET18_VALUES
    assert rc.scaled_layout(base, 4 * rc.RESNET18_VALUES) == base
    for size in (10_000_000, 240_000_000, 1_000_000_000):
        lay = rc.scaled_layout(base, size)
        assert [n for n, _ in lay] == [n for n, _ in base]
        assert rc.layout_bytes(lay) == size
    with pytest.raises(ValueError, match="fewer values"):
        rc.scaled_layout(base, 40)


def test_every_client_maps_the_same_weights(tmp_path: Path) -> None:
    layout = [("a", [3, 4]), ("b", [5])]
    path = tmp_path / "w"
    rc.write_weights(path, layout, seed=1)
    one, two = rc.map_weights(path, layout), rc.map_weights(path, layout)
    assert one["a"].shape == (3, 4) and one["b"].shape == (5,)
    assert np.array_equal(one["a"], two["a"]) and one["a"].dtype == np.float32
    one["b"][0] = 7.0  # copy-on-write: a client's writes stay its own
    assert two["b"][0] != 7.0
    with pytest.raises(ValueError, match="the layout has"):
        rc.map_weights(path, [("a", [3, 4])])


def test_reset_hwm_drops_the_peak_of_what_came_before() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "b = bytearray(300 << 20)\n"
            "b[:: 4096] = b'x' * len(b[:: 4096])\n"
            "del b\n"
            "print('ok', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ok\n"
        before = rw.status_bytes(child.pid, "VmHWM")
        assert before >= 300 << 20  # the 300 MiB it touched and freed
        assert rw.reset_hwm([child.pid]) == 1
        after = rw.status_bytes(child.pid, "VmHWM")
        assert after < before - (200 << 20)
        assert after <= rw.status_bytes(child.pid, "VmRSS") + (4 << 20)
    finally:
        child.kill()
        child.wait()


def test_memory_guard_puts_the_points_processes_first_for_the_oom_killer() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        guard = rw.MemoryGuard(lambda: [child.pid], lambda: None, period=0.01)
        guard.start()
        while not guard.last:
            guard.join(0.05)
        guard.stop()
        assert Path(f"/proc/{child.pid}/oom_score_adj").read_text().strip() == "1000"
        assert Path(f"/proc/{os.getpid()}/oom_score_adj").read_text().strip() != "1000"
        rec = guard.sigkilled("server", clients=3)
        assert rec["failure"] == "killed" and "SIGKILL that the guard did not send" in rec["detail"]
        assert rec["cause"] == "sigkill"
        assert rec["server_rss_bytes"] > 0 and rec["clients"] == 3
    finally:
        child.kill()
        child.wait()


def test_point_failure_names_what_stopped_a_point(tmp_path: Path) -> None:
    """One check serves both sides: a client's non-zero exit, the server's exit (exit 0 only
    for a server that may finish), the deadline; None while all is well."""
    import time

    from bench.harness.round_window import point_failure

    def proc(code: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", code])

    log = tmp_path / "log"
    log.write_text("last words")
    running, done, failed = proc("import time; time.sleep(30)"), proc("pass"), proc("exit(3)")
    try:
        done.wait(30)
        failed.wait(30)
        later = time.monotonic() + 60
        ok = point_failure(
            None, ("server", running, log), [(running, log)], later, "t", server_may_finish=False
        )
        assert ok is None
        bad = point_failure(
            None, ("server", running, log), [(failed, log)], later, "t", server_may_finish=False
        )
        assert bad is not None and bad["failure"] == "error"
        assert bad["detail"] == "client 0 exited 3: last words"
        gone = point_failure(None, ("gateway", done, log), [], later, "t", server_may_finish=False)
        assert gone is not None and gone["detail"].startswith("gateway exited 0")
        assert (
            point_failure(None, ("server", done, log), [], later, "t", server_may_finish=True)
            is None
        )
        late = point_failure(
            None, ("server", running, log), [], 0.0, "no model", server_may_finish=True, clients=1
        )
        assert late == {"ok": False, "failure": "timeout", "detail": "no model", "clients": 1}
    finally:
        running.kill()
        running.wait()


def test_a_tree_holds_grandchildren_and_leaves_out_the_dead_and_strangers() -> None:
    code = "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    other = subprocess.Popen(["sleep", "30"])
    try:
        rw_tree: list[int] = []
        for _ in range(200):  # the grandchild is started by the child
            rw_tree = rw.tree([child.pid, 2**22 + 7])  # the second pid is no process
            if len(rw_tree) == 2:
                break
            threading.Event().wait(0.02)
        assert len(rw_tree) == 2 and child.pid in rw_tree
        assert other.pid not in rw_tree and os.getpid() not in rw_tree
        assert rw.tree([2**22 + 7]) == []
    finally:
        for pid in rw.tree([child.pid]):  # the grandchild too
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for p in (child, other):
            p.kill()
            p.wait()
