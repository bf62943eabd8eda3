"""How the faasd harness finds its namespace's PID 1 (``faasd_start._init_pid``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.containers.faasd_start import _init_pid

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")


def test_the_namespace_pid_1_is_found_past_a_subshell_forked_before_the_exec() -> None:
    """scripts/faasd-up.sh forks subshells (``$(realpath ...)``) before it execs ``unshare``:
    such a child, alive for a second here, is not the namespace's PID 1 (CI once took one for
    it, and every later request into the namespace found no /proc/PID)."""
    script = "x=$(sleep 1); exec unshare --pid --fork --mount-proc sleep 60"
    proc = subprocess.Popen(["bash", "-c", script])
    try:
        pid = _init_pid(proc)
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        # PID 1 inside: its id in its own namespace (the last) is 1. Its program may still be
        # ``unshare``: the child runs it until it has mounted /proc and exec'd (CI once asked in
        # between, and read ``unshare`` from /proc/PID/exe); the pid is the same after the exec.
        ids = _namespace_pids(pid)
        assert ids[0] == pid
        assert ids[-1] == 1
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)


def _namespace_pids(pid: int) -> list[int]:
    """The process's ids, from this pid namespace down to its own (``NSpid`` in its status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(field) for field in line.split()[1:]]
    raise AssertionError(f"/proc/{pid}/status has no NSpid line")
