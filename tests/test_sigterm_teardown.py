"""A pytest stopped by SIGTERM takes the servers its tests started down with it; one stopped by
SIGKILL cannot, and leaves them.

``timeout`` (and a cancelled CI job) sends SIGTERM. Python's default ends the process at once,
without fixture teardown, and the servers the fixtures started (each in a session of its own)
ran on: once MinIO, two Redis, a runtime and two gateways, for 52 minutes. ``tests/conftest.py``
turns SIGTERM into the interruption Ctrl-C makes, so the fixtures are torn down. Each case runs
a real pytest whose test holds the session's real Redis, signals it, and waits for the Redis to
be gone; or, after a SIGKILL, finds it still running, orphaned, and stops it by its PID.

docs/operations.md says: a SIGTERM to the run stops it as Ctrl-C does, the fixtures torn down
and the servers with them; a SIGKILL cannot be caught, and the servers run on until they are
stopped by their PIDs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

#: a test that holds the session's Redis (``tests/conftest.py``'s fixture) until it is stopped
HOLDS_REDIS = """
import os
import time
from pathlib import Path


def test_holds_the_session_redis(redis_server):
    pid = redis_server.proc.pid
    Path(os.environ["PID_FILE"] + ".tmp").write_text(str(pid))
    os.replace(os.environ["PID_FILE"] + ".tmp", os.environ["PID_FILE"])
    time.sleep(600)
"""


def _wait(what: str, done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"{what} after {seconds:.0f} s"
        time.sleep(0.05)


@dataclass
class _Run:
    pytest: subprocess.Popen[bytes]
    redis: psutil.Process
    log: Path


def _gone(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def _pytest_holding_redis(tmp_path: Path, workers: int) -> Iterator[_Run]:
    """A real pytest (``workers`` xdist workers; 0: none) in a session of its own whose test
    holds the session's Redis; both are killed afterwards, whatever the case left."""
    (tmp_path / "test_holds.py").write_text(HOLDS_REDIS)
    pid_file = tmp_path / "redis.pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PID_FILE=str(pid_file), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["-c", os.devnull, "--rootdir", str(tmp_path), "-q", str(tmp_path)]
    if workers:
        argv += ["-n", str(workers)]
    else:
        argv += ["-p", "no:xdist"]
    with open(tmp_path / "pytest.log", "wb") as out:
        run = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait("no Redis pid written", pid_file.exists, 60)
        redis = psutil.Process(int(pid_file.read_text()))
        assert not _gone(redis) and "redis" in redis.name()
        yield _Run(run, redis, tmp_path / "pytest.log")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
        if pid_file.exists():  # a failing case leaves no Redis behind either
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("workers", "to_group"),
    [
        (0, False),
        # over 5 s (execnet interrupts a worker told to stop after 5 s): `make test-slow`
        pytest.param(1, False, marks=pytest.mark.slow),
        (1, True),
    ],
    ids=["pytest", "xdist-controller-only", "xdist-process-group-as-timeout-does"],
)
def test_a_sigterm_to_pytest_stops_the_servers_its_fixtures_started(
    tmp_path: Path, workers: int, to_group: bool
) -> None:
    with _pytest_holding_redis(tmp_path, workers) as held:
        if to_group:
            os.killpg(held.pytest.pid, signal.SIGTERM)
        else:
            held.pytest.send_signal(signal.SIGTERM)
        held.pytest.wait(60)
        _wait("the Redis outlived its pytest", lambda: _gone(held.redis), 30)
    log = held.log.read_text()
    assert held.pytest.returncode == 2 and "KeyboardInterrupt" in log, log


def test_a_sigkilled_pytest_leaves_the_servers_its_fixtures_started(tmp_path: Path) -> None:
    """SIGKILL (``kill -9``, ``timeout -s KILL``) cannot be caught: no fixture is torn down,
    and the Redis, in a session of its own, runs on until it is stopped by its PID."""
    with _pytest_holding_redis(tmp_path, 0) as held:
        os.killpg(held.pytest.pid, signal.SIGKILL)  # its whole group, as timeout signals it
        assert held.pytest.wait(60) == -signal.SIGKILL
        assert not _gone(held.redis) and "redis" in held.redis.name()
        assert held.redis.ppid() != held.pytest.pid  # an orphan now: nothing left to stop it
        os.killpg(held.redis.pid, signal.SIGTERM)  # as the docs say: stopped by its PID
        _wait("the Redis outlived a SIGTERM", lambda: _gone(held.redis), 30)
