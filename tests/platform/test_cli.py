"""The ``fedfaas`` command: real ``up``/``status``/``deploy``/``down`` as separate processes, and
clear errors (exit code 2) on bad command lines."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fedfaas.cli import main
from fedfaas.platform import state
from fedfaas.platform.context import PLATFORM_ID_VAR
from fedfaas.platform.procs import marked
from tests.commands import run_module
from tests.platform.conftest import ANY_PORTS, ANY_PORTS_ENV

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "stack.yml"


def fedfaas(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``fedfaas ARGS``; ``env`` (default: this one on any free ports, no OpenFaaS URL)."""
    if env is None:
        env = {**os.environ, **ANY_PORTS_ENV}
        env.pop("OPENFAAS_URL", None)
    return run_module("fedfaas.cli", *args, timeout=timeout, env=env)


def echo(runtime: str, state_dir: Path, context: ssl.SSLContext | None = None) -> bool:
    """True when ``runtime``'s ``echo`` function echoes bytes back (with the function token)."""
    token = (state_dir / "secrets" / "function-token").read_text().strip()
    req = urllib.request.Request(
        f"{runtime}/function/echo",
        data=b"ping \x00\xff",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30, context=context) as r:
        return bool(r.status == 200 and r.read() == b"ping \x00\xff")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def up_with_all(state_dir: Path) -> None:
    """``fedfaas up --with all`` in ``state_dir``, every part on a free port; asserts it is up."""
    ports = json.dumps(
        dict.fromkeys(
            ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane"), 0
        )
    )
    env = {**os.environ, "FEDFAAS_PORTS": ports, **ANY_PORTS_ENV}
    up = fedfaas("up", "--with", "all", "--state-dir", str(state_dir), timeout=600, env=env)
    assert up.returncode == 0, up.stdout + up.stderr


@pytest.fixture()
def state_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "state"
    yield d
    fedfaas("down", "--state-dir", str(d))  # whatever the test left running


@pytest.mark.slow  # over 10 s: `make test-slow`
@pytest.mark.integration
def test_up_status_deploy_invoke_down_leaves_nothing_behind(state_dir: Path) -> None:
    up = fedfaas("up", "--state-dir", str(state_dir), "--stack", str(STACK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert (
        "fedfaas is up" in up.stdout and "echo 1/1" in up.stdout and "aggregator 1/1" in up.stdout
    )

    st = state.load(state_dir)
    assert st is not None
    assert [r.name for r in st.services] == ["minio", "redis", "runtime", "supervisor"]
    runtime = st.record("runtime")
    assert runtime is not None
    # `up` has exited; the parts keep running as daemons
    assert all(not _gone(r.pid) for r in st.services)
    family = marked(PLATFORM_ID_VAR, st.platform_id)  # (redis-server rewrites its environ)
    replicas = [p for p in family if p.pid not in {r.pid for r in st.services}]
    assert replicas, "the echo replica carries the platform id too"

    status = fedfaas("status", "--json", "--state-dir", str(state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["healthy"] and report["running"]
    assert {p["name"] for p in report["parts"] if p["alive"] and p["ready"]} == {
        "minio",
        "redis",
        "runtime",
        "supervisor",
    }
    assert report["ebpf_mode"] in ("ebpf", "userspace") and report["ebpf_reason"]
    assert [f["name"] for f in report["functions"]] == ["aggregator", "digits-evaluator", "echo"]
    text = fedfaas("status", "--state-dir", str(state_dir))
    assert f"eBPF: {report['ebpf_mode']}" in text.stdout

    again = fedfaas("up", "--state-dir", str(state_dir), "--stack", str(STACK))
    assert again.returncode == 0 and "already running" in again.stdout
    assert state.load(state_dir) == st

    deploy = fedfaas("deploy", "-f", str(STACK), "--state-dir", str(state_dir))
    assert deploy.returncode == 0, deploy.stderr
    assert "202 echo (PUT)" in deploy.stdout

    # TLS by default: the runtime serves https with the CA `status` names; plain HTTP is a 400
    ca = state_dir / "secrets" / "tls" / "ca.crt"
    assert runtime.address.startswith("https://") and f"TLS CA: {ca}" in text.stdout
    assert report["tls_ca"] == str(ca)
    assert echo(runtime.address, state_dir, ssl.create_default_context(cafile=str(ca)))
    plain = runtime.address.replace("https://", "http://")
    with pytest.raises(urllib.error.HTTPError) as refused:
        echo(plain, state_dir)
    assert refused.value.code == 400 and b"tls_required" in refused.value.read()

    down = fedfaas("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert "stopped: minio, redis, runtime, supervisor" in down.stdout
    assert all(_gone(p.pid) for p in family)
    assert marked(PLATFORM_ID_VAR, st.platform_id) == []
    assert sorted(p.name for p in state_dir.iterdir()) == ["logs"]

    after = fedfaas("status", "--state-dir", str(state_dir))
    assert after.returncode == 3 and "not running" in after.stdout
    assert fedfaas("down", "--state-dir", str(state_dir), "--purge").returncode == 0
    assert not state_dir.exists()


@pytest.mark.slow  # over 10 s: `make test-slow`
@pytest.mark.integration
def test_up_with_no_tls_serves_plain_http_and_mints_no_certificates(state_dir: Path) -> None:
    """``fedfaas up --no-tls`` (and ``FEDFAAS_TLS=false``): plain HTTP, no ``secrets/tls``
    folder, no ``TLS CA:`` line; the runtime answers over http."""
    up = fedfaas("up", "--no-tls", "--state-dir", str(state_dir), "--stack", str(STACK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "TLS CA:" not in up.stdout
    st = state.load(state_dir)
    assert st is not None and not st.tls
    runtime = st.record("runtime")
    assert runtime is not None and runtime.address.startswith("http://")
    assert (state_dir / "secrets").is_dir() and not (state_dir / "secrets" / "tls").exists()
    assert echo(runtime.address, state_dir)
    report = json.loads(fedfaas("status", "--json", "--state-dir", str(state_dir)).stdout)
    assert report["healthy"] and report["tls_ca"] == ""
    assert fedfaas("down", "--state-dir", str(state_dir)).returncode == 0
    env = {**os.environ, **ANY_PORTS_ENV, "FEDFAAS_TLS": "false"}
    env.pop("OPENFAAS_URL", None)
    up = fedfaas("up", "--state-dir", str(state_dir), "--stack", str(STACK), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    st = state.load(state_dir)
    assert st is not None and not st.tls and not (state_dir / "secrets" / "tls").exists()


@pytest.mark.integration
def test_up_on_a_taken_port_fails_clearly_and_starts_nothing(state_dir: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = fedfaas(
            "up", "--state-dir", str(state_dir), "--stack", str(STACK), "--redis-port", str(port)
        )
    assert res.returncode == 1
    assert f"port {port}" in res.stderr and "already in use" in res.stderr
    assert state.leftovers(state_dir) == []


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["launch"],
        ["up", "--runtime-port", "http"],
        ["up", "--redis-port", "70000"],
        ["up", "--stack", "/nonexistent/stack.yml"],
        ["up", "--with", "bogus"],
        ["deploy"],
        ["deploy", "-f", "/nonexistent/stack.yml"],
        ["status", "--bogus"],
    ],
)
def test_bad_command_line_is_a_clear_error_with_exit_code_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: fedfaas" in err and "error:" in err


def test_state_dir_that_is_a_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["status", "--state-dir", str(f)])
    assert exc.value.code == 2
    assert "not a folder" in capsys.readouterr().err


@pytest.mark.integration
def test_smoke_run_invokes_echo_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedfaas.platform import smoke
    from fedfaas.settings import PlatformSettings

    monkeypatch.delenv("OPENFAAS_URL", raising=False)
    settings = PlatformSettings(state_dir=tmp_path / "s", stack_file=STACK, **ANY_PORTS)
    lines: list[str] = []
    smoke.run(settings, lines.append)
    text = "\n".join(lines)
    assert "echo answered 200 with the payload" in text and "smoke run passed" in text
    assert "platform: healthy" in text
    assert sorted(p.name for p in settings.state_dir.iterdir()) == ["logs"]


@pytest.mark.integration
def test_up_without_minio_names_the_missing_binary_and_leaves_nothing(
    state_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "cache"
    empty.mkdir()
    env = {**os.environ, **ANY_PORTS_ENV, "PATH": "/usr/bin:/bin", "FEDFAAS_CACHE": str(empty)}
    res = fedfaas("up", "--state-dir", str(state_dir), timeout=60, env=env)
    assert res.returncode == 1
    assert "minio: cannot start: minio not found" in res.stderr and "make setup" in res.stderr
    assert "Traceback" not in res.stderr
    assert state.leftovers(state_dir) == []


def test_down_and_status_with_nothing_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "never"
    assert main(["-q", "down", "--state-dir", str(d)]) == 0
    assert "nothing was running" in capsys.readouterr().out
    assert main(["-q", "status", "--state-dir", str(d)]) == 3
    assert "not running" in capsys.readouterr().out


@pytest.mark.integration
@pytest.mark.slow  # runs the other components' servers too; in `make test-all`
def test_up_with_all_parts_reports_the_gateway_router_and_cleans_shm(state_dir: Path) -> None:
    up_with_all(state_dir)
    st = state.load(state_dir)
    assert st is not None
    names = [r.name for r in st.services]
    assert names == [
        "minio",
        "redis",
        "runtime",
        "gateway",
        "gateway-node1",
        "cache-engine",
        "request-tracker",
        "control-plane",
        "console",
        "supervisor",
    ]
    report = json.loads(fedfaas("status", "--json", "--state-dir", str(state_dir)).stdout)
    assert report["healthy"]
    # TLS by default: every part but MinIO, Redis and the supervisor serves https
    plain = {"minio", "redis", "supervisor"}
    served = {p["name"]: p["address"] for p in report["parts"] if p["name"] not in plain}
    assert all(a.startswith("https://") for a in served.values()), served
    assert report["tls_ca"] == str(state_dir / "secrets" / "tls" / "ca.crt")
    assert report["ebpf_reason"].startswith("node gateway:")
    shm = Path(next(p["extra"]["shm"] for p in report["parts"] if p["name"] == "gateway"))
    assert shm.parent == Path("/dev/shm")
    sockets = [Path(p["extra"]["router_socket"]) for p in report["parts"] if "gateway" in p["name"]]
    assert len(sockets) == 2 and all(s.is_socket() for s in sockets)
    family = marked(PLATFORM_ID_VAR, st.platform_id)

    assert fedfaas("down", "--state-dir", str(state_dir)).returncode == 0
    assert all(_gone(p.pid) for p in family)
    assert marked(PLATFORM_ID_VAR, st.platform_id) == []
    assert not shm.exists()
    assert not any(s.exists() or s.parent.exists() for s in sockets)
    assert sorted(p.name for p in state_dir.iterdir()) == ["logs"]


@pytest.mark.slow  # over 5 s: `make test-slow`
@pytest.mark.integration
def test_up_keeps_the_object_stores_in_the_shm_dir_it_is_given(
    state_dir: Path, tmp_path: Path
) -> None:
    """``fedfaas up --shm-dir DIR`` (a tmpfs of its own caps the stores' memory): the node
    gateways keep their stores under DIR, ``status`` says so, ``down`` removes them there."""
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir(mode=0o700)
    ports = json.dumps(dict.fromkeys(("gateway", "gateway_node1"), 0))
    up = fedfaas(
        *("up", "--with", "gateway", "--shm-dir", str(shm_dir), "--state-dir", str(state_dir)),
        timeout=300,
        env={**os.environ, "FEDFAAS_PORTS": ports, **ANY_PORTS_ENV},
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        report = json.loads(fedfaas("status", "--json", "--state-dir", str(state_dir)).stdout)
        gateways = [p for p in report["parts"] if "gateway" in p["name"]]
        roots = {Path(p["extra"]["shm"]) for p in gateways}
        assert len(gateways) == 2 and len(roots) == 1
        root = next(iter(roots))
        assert root.parent == shm_dir.resolve()
        st = state.load(state_dir)
        assert st is not None and st.shm_dir == str(shm_dir.resolve())
        for part in ("gateway", "gateway-node1"):  # each gateway runs with that store root
            rec = st.record(part)
            assert rec is not None
            argv = psutil.Process(rec.pid).cmdline()
            assert argv[argv.index("--shm-root") + 1] == str(root)
        root.mkdir(mode=0o700)  # as a gateway makes it at its first job
    finally:
        assert fedfaas("down", "--state-dir", str(state_dir)).returncode == 0
    assert list(shm_dir.iterdir()) == []
    bad = fedfaas("up", "--shm-dir", str(tmp_path / "nowhere"), "--state-dir", str(state_dir))
    assert bad.returncode == 2 and "no such folder" in bad.stderr


def _family(st: state.PlatformState) -> list[psutil.Process]:
    """Every process the platform started and that runs now: its recorded parts, all their
    descendants (function replicas, their children), and the processes that carry its id."""
    found: dict[int, psutil.Process] = {}
    for rec in st.services:
        try:
            p = psutil.Process(rec.pid)
            found[p.pid] = p
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    found.update((p.pid, p) for p in marked(PLATFORM_ID_VAR, st.platform_id))
    return list(found.values())


def _running(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` still running (the same process: ``is_running`` checks its start)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.mark.integration
def test_down_stops_every_part_when_the_clock_moved_their_recorded_start_by_a_second(
    state_dir: Path,
) -> None:
    """The wall-clock start psutil gives a process is its start since boot plus /proc/stat's
    boot time, a whole second that moves when the clock is adjusted: a part's recorded start
    then seems a second off. ``down`` (and the supervisor) must still know its parts: it took
    them all for dead, stopped none by its records, and redis-server (its environment wiped
    by its process title, so not found by the platform's id either) outlived ``down``."""
    up = fedfaas("up", "--state-dir", str(state_dir), "--stack", str(STACK))
    assert up.returncode == 0, up.stdout + up.stderr
    with state.locked(state_dir, wait_s=30):
        st = state.load(state_dir)
        assert st is not None
        for rec in st.services:
            rec.create_time += 1.0  # as after a one-second step of /proc/stat's btime
        state.save(st)
    started = _family(st)
    assert any("redis-server" in " ".join(p.cmdline()) for p in started)
    down = fedfaas("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped: minio, redis, runtime, supervisor" in down.stdout
    assert _running(started) == []


@pytest.mark.integration
def test_the_sweep_of_down_finds_a_process_that_wiped_its_environment_by_its_folder(
    tmp_path: Path,
) -> None:
    """``down``'s last sweep takes the platform's processes by the id in their environment, and
    one whose environment is wiped (redis-server's, under its process title) by its working
    folder in the platform's own; a process with an environment in that folder is not taken."""
    from core.services import RedisServer

    data = tmp_path / "state" / "data"
    redis = RedisServer(data_dir=data / "redis").start()
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], cwd=data / "redis"
    )
    try:
        found = {p.pid for p in marked(PLATFORM_ID_VAR, "no-such-platform", [data])}
        assert redis.pid in found and other.pid not in found
        assert marked(PLATFORM_ID_VAR, "no-such-platform") == []
    finally:
        other.kill()
        other.wait()
        redis.stop()


@pytest.mark.integration
@pytest.mark.slow  # fedfaas up --with all and a round of 120 ResNet-18-sized updates
def test_down_after_a_round_of_120_resnet18_updates_leaves_no_process_it_started(
    state_dir: Path,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from client.sdk import FLClient, create_job
    from tests.dataplane.test_gateway_sigterm import bodies

    up_with_all(state_dir)
    st = state.load(state_dir)
    assert st is not None
    gw = st.record("gateway")
    assert gw is not None
    secret = (state_dir / "secrets" / "gateway-admin-secret").read_text().strip()
    ups = bodies(4)
    clients = [f"c{i}" for i in range(120)]
    ca = state_dir / "secrets" / "tls" / "ca.crt"  # fedfaas up's default: TLS
    job = create_job(
        gw.address, secret, "big", ups[0], rounds=2, goal=120, clients=clients, ca_file=ca
    )
    fl = [FLClient(gw.address, "big", c, job.tokens[c], timeout=300, ca_file=ca) for c in clients]

    def upload(i: int) -> None:
        assert fl[i].upload(1, ups[i % len(ups)], 10 + i).round == 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(upload, range(len(clients))))
    assert fl[0].wait_for_version(1, timeout=600).version == 1
    for c in fl:
        c.close()
    st = state.load(state_dir)  # as it is now (the supervisor may have restarted a part)
    assert st is not None
    started = _family(st)
    replicas = [p for p in started if "runtime.watchdog" in " ".join(p.cmdline())]
    assert replicas, "the function replicas are among the processes down must stop"
    t0 = time.monotonic()
    down = fedfaas("down", "--state-dir", str(state_dir), timeout=600)
    print(f"down took {time.monotonic() - t0:.1f}s for {len(started)} processes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _running(started) == []
    assert marked(PLATFORM_ID_VAR, st.platform_id, [state_dir]) == []
