"""The runtime's ``--watchdog PATH``: every replica is OpenFaaS's real of-watchdog (HTTP mode) in
front of the Docker template's server (template/python3-http/index.py), as on Kubernetes.

of-watchdog serves its metrics on the fixed port 8081, so only one of its replicas can run on a
machine at a time: each test deploys one function and removes it at the end.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from runtime import RuntimeProcess
from runtime.replicas import TEMPLATE_INDEX
from tests.openfaas.conftest import require_binary, under_ci
from tests.polling import wait_until
from tests.runtime.conftest import (
    FN_AUTH,
    REPO,
    STACK,
    available,
    client,
    echo_body,
    serving,
    with_function_token,
)

SLOW = Path(__file__).resolve().parent / "slow_handler"
BODY_MB = 200
#: of-watchdog's Prometheus port, fixed upstream
METRICS_PORT = 8081


def _require_waitress() -> None:
    """The template's server needs waitress (template/python3-http/requirements.txt)."""
    try:
        import waitress  # noqa: F401
    except ImportError:
        reason = "waitress (template/python3-http/requirements.txt) is not installed"
        if under_ci():
            pytest.fail(f"under CI: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def wd_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """A runtime started with ``--watchdog <of-watchdog>`` and the function token secret."""
    binary = require_binary("of-watchdog")
    _require_waitress()
    state_dir = tmp_path_factory.mktemp("watchdog-runtime")
    settings = {"watchdog": binary, "ready_wait": 20}
    with serving(RuntimeProcess(stack=STACK, state_dir=state_dir, settings=settings)) as rt:
        yield rt


@pytest.fixture()
def http(wd_runtime: RuntimeProcess) -> Iterator[httpx.Client]:
    with client(wd_runtime, timeout=120) as c:
        yield c


@contextmanager
def _deployed(http: httpx.Client, body: dict[str, object]) -> Iterator[str]:
    """Deploy, wait for its one replica, yield the name; remove it and wait until the replica's
    processes are gone."""
    name = str(body["service"])
    r = http.post("/system/functions", json=body)
    assert r.status_code == 202, r.text
    try:
        wait_until(lambda: available(http, name) == 1, timeout=60)
        yield name
    finally:
        http.request("DELETE", "/system/functions", json={"functionName": name})
        wait_until(lambda: available(http, name) == -1, timeout=30)
        # of-watchdog's metrics port is fixed: the next test's replica needs this one gone
        wait_until(_metrics_port_free, timeout=30)


def _metrics_port_free() -> bool:
    """Whether of-watchdog could bind ``:8081`` (dual-stack where the host has IPv6, as Go)."""
    family, host = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "0.0.0.0")
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners
        try:
            sock.bind((host, METRICS_PORT))
        except OSError:
            return False
    return True


def _replica(http: httpx.Client, name: str) -> dict[str, Any]:
    """The function's one replica, as ``/system/replicas/{name}`` describes it."""
    (row,) = http.get(f"/system/replicas/{name}").json()
    return dict(row)


@pytest.fixture()
def echo(http: httpx.Client) -> Iterator[str]:
    with _deployed(http, echo_body("wd-echo")) as name:
        yield name


def test_large_body_echoed_byte_identical(http: httpx.Client, echo: str) -> None:
    chunk = os.urandom(1 << 20)
    sent = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for i in range(BODY_MB):
            piece = chunk[i:] + chunk[:i]
            sent.update(piece)
            yield piece

    got = hashlib.sha256()
    size = 0
    with http.stream("POST", f"/function/{echo}", content=body()) as r:
        assert r.status_code == 200
        for part in r.iter_bytes():
            got.update(part)
            size += len(part)
    assert size == BODY_MB << 20
    assert got.hexdigest() == sent.hexdigest()


def test_function_token_enforced(wd_runtime: RuntimeProcess, http: httpx.Client, echo: str) -> None:
    with httpx.Client(base_url=wd_runtime.url, trust_env=False, timeout=30) as bare:
        r = bare.post(f"/function/{echo}", content=b"hello")
        assert r.status_code == 401
        assert r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = bare.post(f"/function/{echo}", content=b"hello", headers=FN_AUTH)
        assert r.status_code == 200 and r.content == b"hello"
    # the replica itself (of-watchdog's port) refuses too
    port = _replica(http, echo)["port"]
    direct = httpx.post(f"http://127.0.0.1:{port}/", content=b"x", trust_env=False)
    assert direct.status_code == 401
    health = httpx.get(f"http://127.0.0.1:{port}/_/health", trust_env=False)
    assert health.status_code == 200  # of-watchdog's own health check needs no token


def test_replica_is_of_watchdog_and_sigterm_stops_both(http: httpx.Client) -> None:
    with _deployed(http, echo_body("wd-stop")) as name:
        wd_pid = int(_replica(http, name)["pid"])
        assert Path(f"/proc/{wd_pid}/exe").resolve() == require_binary("of-watchdog").resolve()
        server_pid = _template_server(wd_pid)
        argv = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")
        assert str(TEMPLATE_INDEX).encode() in argv  # the template's server, forked by it
        pids = [wd_pid, server_pid]
    # removed: SIGTERM to the replica's process group stops of-watchdog and the server
    # (the runtime reaps of-watchdog, of-watchdog the server)
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), timeout=15)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_replica_outlives_the_runtime(tmp_path: Path, sig: signal.Signals) -> None:
    binary = require_binary("of-watchdog")
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt", settings={"watchdog": binary})
    try:
        with_function_token(rt.start())
        with client(rt) as http:
            assert http.post("/system/functions", json=echo_body("orphan")).status_code == 202
            wait_until(lambda: available(http, "orphan") == 1, timeout=60)
            wd_pid = int(_replica(http, "orphan")["pid"])
        server_pid = _template_server(wd_pid)
        assert rt.pid is not None
        os.kill(rt.pid, sig)
        rt.proc.wait(30)  # type: ignore[union-attr]
        # zombies count as gone: with the runtime dead nobody may reap its child at once
        wait_until(lambda: all(_gone(p) for p in (wd_pid, server_pid)), timeout=15)
        wait_until(_metrics_port_free, timeout=15)
    finally:
        rt.stop()


def _template_server(wd_pid: int) -> int:
    """The one child of-watchdog forked: found by parent pid over all of /proc.

    Not from ``/proc/PID/task/PID/children``: that lists the children of one thread only, and
    of-watchdog is a Go program whose fork may run on any of its threads (seen under CI as an
    empty list while the server was up)."""
    (child,) = psutil.Process(wd_pid).children()
    return int(child.pid)


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_exec_timeout_answers_504(http: httpx.Client) -> None:
    body = echo_body(
        "wd-slow",
        annotations={"com.fedfaas.handler": str(SLOW)},
        envVars={"exec_timeout": "1s", "read_timeout": "10s", "write_timeout": "10s"},
    )
    with _deployed(http, body) as name:
        started = time.monotonic()
        r = http.get(f"/function/{name}", params={"seconds": "5"})
        assert r.status_code == 504  # of-watchdog's answer when exec_timeout expires
        assert time.monotonic() - started < 4.5
        r = http.get(f"/function/{name}", params={"seconds": "0"})
        assert r.status_code == 200 and r.json() == {"slept": 0.0}


def test_aggregator_status(http: httpx.Client, tmp_path: Path) -> None:
    """Without its node's router socket the aggregator serves no job, but GET / says so: each of
    its endpoints (stack.yml: 2) reports that it cannot register."""
    socket_path = tmp_path / "no-router.sock"
    body = _stack_body("aggregator", "wd-aggregator")
    env = dict(body["envVars"])  # type: ignore[call-overload]
    body["envVars"] = {**env, "FEDFAAS_GATEWAY_ROUTER_SOCKET": str(socket_path)}
    with _deployed(http, body) as name:
        url = f"/function/{name}/"
        wait_until(lambda: len(http.get(url).json()["endpoints"]) == 2, timeout=30)
        r = http.get(url)
        assert r.status_code == 200, r.text
        assert r.json()["router_socket"] == str(socket_path)
        for endpoint in r.json()["endpoints"]:
            assert endpoint["endpoint"] is None
            assert endpoint["last_error"].startswith("cannot register"), endpoint


def test_second_replica_cannot_start(http: httpx.Client) -> None:
    """of-watchdog's metrics port is fixed (8081): a second replica on the machine exits
    (Go's panic) while the first runs, and the runtime keeps restarting it."""
    with _deployed(http, echo_body("wd-two")) as name:
        logs = Path(_replica(http, name)["log"]).parent
        r = http.post(f"/system/scale-function/{name}", json={"replicas": 2})
        assert r.status_code == 202
        panic = "listen tcp :8081: bind: address already in use"
        wait_until(lambda: any(panic in f.read_text() for f in logs.glob("*.log")))
        assert available(http, name) == 1


def test_update_keeps_the_old_replica(http: httpx.Client) -> None:
    """For the same reason an update cannot roll: its new replica exits while the old one runs,
    and the old one serves on (it stops only once the new one is ready)."""
    body = echo_body("wd-update")
    with _deployed(http, body) as name:
        old = _replica(http, name)
        logs = Path(old["log"]).parent
        body["envVars"] = {**dict(body["envVars"]), "UPDATED": "1"}  # type: ignore[call-overload]
        assert http.put("/system/functions", json=body).status_code == 202
        panic = "listen tcp :8081: bind: address already in use"
        wait_until(lambda: any(panic in f.read_text() for f in logs.glob("*.log")))
        ready = [r for r in http.get(f"/system/replicas/{name}").json() if r["state"] == "ready"]
        assert [(r["pid"], r["generation"]) for r in ready] == [(old["pid"], old["generation"])]
        assert http.post(f"/function/{name}", content=b"still here").content == b"still here"


def test_flstore_status(http: httpx.Client) -> None:
    handler = {"com.fedfaas.handler": str(REPO / "functions/flstore")}
    with _deployed(http, echo_body("wd-flstore", annotations=handler)) as name:
        r = http.get(f"/function/{name}/ping")
        assert r.status_code == 200, r.text
        assert r.json()["ok"] is True
        r = http.get(f"/function/{name}/objects")
        assert r.status_code == 200 and r.json()["objects"] == []
        r = http.post(f"/function/{name}/load", content=b"not json")
        assert r.status_code == 400 and r.json()["error"] == "bad_json"


def _stack_body(function: str, service: str) -> dict[str, object]:
    from core.stackfile import PLATFORM_STACK, load_stack

    stack = load_stack(STACK)
    fn = stack.functions.get(function) or load_stack(PLATFORM_STACK).functions[function]
    body = fn.deployment()
    body["service"] = service
    return body
