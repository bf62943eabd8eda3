"""Platform up/status/down with real processes: MinIO, Redis and a supervisor-like part.

The supervisor part stands in for the runtime: an HTTP server that starts a "replica" in a
session of its own which ignores SIGTERM, the hardest case for ``down``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from core.services import http_ok
from fedfaas.platform import (
    AlreadyRunning,
    Platform,
    PortSpec,
    ServiceFailed,
    ServiceSpec,
    procs,
    state,
)
from fedfaas.platform.context import PLATFORM_ID_VAR
from fedfaas.platform.parts import MINIO, REDIS
from fedfaas.platform.procs import marked
from fedfaas.settings import PlatformSettings
from tests.platform.conftest import ANY_PORTS

pytestmark = pytest.mark.integration

SUPERVISOR = r"""
import http.server, os, signal, subprocess, sys
replica = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
open(sys.argv[2], "w").write(str(replica.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _supervisor(script: Path) -> ServiceSpec:
    return ServiceSpec(
        name="supervisor",
        ports=(PortSpec("supervisor", 0),),
        argv=lambda ctx: [
            sys.executable,
            str(script),
            str(ctx.ports["supervisor"]),
            str(ctx.run_dir("supervisor") / "replica.pid"),
        ],
        prepare=lambda ctx: ctx.run_dir("supervisor").mkdir(parents=True, exist_ok=True),
        ready=lambda ctx: http_ok(ctx.url("supervisor") + "/"),
        address=lambda ctx: ctx.url("supervisor"),
        depends=("redis",),
    )


@pytest.fixture()
def settings(tmp_path: Path) -> PlatformSettings:
    stack = tmp_path / "stack.yml"
    stack.write_text("version: 1.0\nprovider: {name: openfaas}\nfunctions: {}\n")
    return PlatformSettings(
        state_dir=tmp_path / "state",
        stack_file=stack,
        stop_timeout=1.0,
        start_timeout=60.0,
        **ANY_PORTS,
    )


@pytest.fixture()
def platform(settings: PlatformSettings, tmp_path: Path) -> Iterator[Platform]:
    script = tmp_path / "supervisor.py"
    script.write_text(SUPERVISOR)
    p = Platform(settings, parts=[MINIO, REDIS, _supervisor(script)])
    yield p
    p.down(purge=True)


def _replica_pid(settings: PlatformSettings) -> int:
    path = settings.state_dir / "run" / "supervisor" / "replica.pid"
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "supervisor never wrote its replica pid"
        time.sleep(0.05)
    return int(path.read_text())


def test_up_status_down_leaves_no_process_and_a_clean_folder(
    platform: Platform, settings: PlatformSettings
) -> None:
    result = platform.up()
    assert not result.already_running
    st = result.state
    assert [r.name for r in st.services] == ["minio", "redis", "supervisor"]
    replica = _replica_pid(settings)
    pids = [r.pid for r in st.services] + [replica]
    assert all(psutil.pid_exists(p) for p in pids)

    report = platform.status()
    assert report.running and report.healthy
    assert {p.name: (p.alive, p.ready) for p in report.parts} == {
        "minio": (True, True),
        "redis": (True, True),
        "supervisor": (True, True),
    }
    assert report.ebpf_mode in ("ebpf", "userspace") and report.ebpf_reason

    # every daemon runs in its own session, so it outlives the command that started it
    for r in st.services:
        assert os.getsid(r.pid) == r.pid

    assert platform.up().already_running  # idempotent

    assert platform.down() == ["minio", "redis", "supervisor"]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
    assert marked(PLATFORM_ID_VAR, st.platform_id) == []
    assert state.leftovers(settings.state_dir) == []
    assert (settings.state_dir / "logs" / "minio.log").exists()
    assert not platform.status().running


def test_dead_part_makes_status_degraded_and_up_refuse_until_down(
    platform: Platform, settings: PlatformSettings
) -> None:
    st = platform.up().state
    replica = _replica_pid(settings)
    supervisor = st.record("supervisor")
    assert supervisor is not None
    os.kill(supervisor.pid, signal.SIGKILL)  # its replica is orphaned, in another session
    deadline = time.monotonic() + 10
    while platform.status().healthy:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    report = platform.status()
    assert {p.name for p in report.parts if not p.alive} == {"supervisor"}

    with pytest.raises(AlreadyRunning, match="partly running") as err:
        platform.up()
    assert err.value.dead == ["supervisor"]

    platform.down()
    assert not psutil.pid_exists(replica) or psutil.Process(replica).status() == "zombie"
    assert marked(PLATFORM_ID_VAR, st.platform_id) == []
    assert state.leftovers(settings.state_dir) == []


# a part that exits at once, saying why, after Redis started
BROKEN = ServiceSpec(
    name="broken",
    ports=(PortSpec("broken", 0),),
    argv=lambda ctx: [sys.executable, "-c", "import sys; print('no config here'); sys.exit(3)"],
    ready=lambda ctx: False,
    address=lambda ctx: "-",
    depends=("redis",),
)


def test_part_that_exits_at_start_rolls_back_and_shows_its_log(settings: PlatformSettings) -> None:
    platform = Platform(settings, parts=[REDIS, BROKEN])
    with pytest.raises(ServiceFailed) as err:
        platform.up()
    assert err.value.service == "broken"
    assert "exited with code 3" in str(err.value) and "no config here" in str(err.value)
    assert not platform.status().running
    assert state.leftovers(settings.state_dir) == []
    assert "no config here" in (settings.state_dir / "logs" / "broken.log").read_text()
    platform.down(purge=True)
    assert not settings.state_dir.exists()


def test_a_rollback_cut_short_keeps_the_record_so_down_stops_what_it_left(
    settings: PlatformSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``up``'s rollback removed the state record in a ``finally``, so a rollback
    cut short (a second Ctrl-C as it began) left Redis running with no record of it: ``down``
    then said nothing was running and stopped nothing."""
    platform = Platform(settings, parts=[REDIS, BROKEN])

    def interrupted(*_: object, **__: object) -> list[int]:
        raise KeyboardInterrupt  # the second Ctrl-C, as the rollback stops its first part

    monkeypatch.setattr(procs, "stop_tree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        platform.up()
    monkeypatch.undo()
    st = state.load(settings.state_dir)
    assert st is not None  # the record outlives the rollback that did not finish
    redis = st.record("redis")
    assert redis is not None and redis.alive()
    assert platform.down(purge=True) == ["redis"]
    assert not redis.alive()
    folders = [settings.state_dir / "data", settings.state_dir / "run"]
    assert marked(PLATFORM_ID_VAR, st.platform_id, folders) == []
    assert not settings.state_dir.exists()
