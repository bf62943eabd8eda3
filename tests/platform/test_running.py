"""The tests' platform helper stops a platform whose ``fedfaas up`` was killed half-way.

A fixture timing out in ``fedfaas up`` (pytest-timeout, or ``subprocess``'s timeout) kills the
``up`` process, which then cannot tear down what it had started; one such platform (12
processes) was found running after a helper's timed-out run. :func:`running_platform` runs
``fedfaas down`` on every way out; these tests kill ``up`` the way a timeout does and check that
nothing of the platform is left.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedfaas.platform import state
from tests.commands import REPO
from tests.platform.running import (
    any_ports_env,
    platform_processes,
    running_platform,
    stop_platform,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration


def test_down_stops_the_parts_of_an_up_killed_half_way(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = any_ports_env()
    up = subprocess.Popen(
        [sys.executable, "-m", "fedfaas.cli", "up", "--with", "all", "--state-dir", str(state_dir)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def two_parts_alive() -> state.PlatformState | None:
            st = state.load(state_dir)
            return st if st is not None and sum(r.alive() for r in st.services) >= 2 else None

        started = wait_until(two_parts_alive, timeout=120, what="two parts of the platform up")
        up.send_signal(signal.SIGKILL)  # what subprocess.run does to it at its timeout
        assert up.wait(30) == -signal.SIGKILL, "up finished before it was killed: not half-way"
        orphans = platform_processes(started)
        assert len(orphans) >= 2, "the killed up's parts keep running without it"
    finally:
        up.kill()
        left = stop_platform(state_dir, env)
    assert left == set(), f"fedfaas down left {sorted(left)} running"
    assert state.leftovers(state_dir) == []


def test_a_failing_block_still_stops_the_platform(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    seen: list[state.PlatformState] = []
    with pytest.raises(RuntimeError, match="the test failed"):  # noqa: SIM117
        with running_platform(state_dir, env=any_ports_env(), timeout=300) as st:
            seen.append(st)
            assert platform_processes(st), "the platform runs inside the block"
            raise RuntimeError("the test failed")
    assert seen and platform_processes(seen[0]) == set()
