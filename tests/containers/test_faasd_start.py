"""How the faasd harness finds its namespace's PID 1 (``faasd_start._init_pid``)."""

from __future__ import annotations

import os
import subprocess

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
        assert os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "sleep"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
