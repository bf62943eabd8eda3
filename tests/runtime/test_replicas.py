"""Replica processes: health, replacement, scaling, rolling updates and clean shutdown."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import STACK, available, client, echo_body, with_function_token

pytestmark = pytest.mark.integration


def _pids(http: httpx.Client, name: str) -> list[int]:
    return [
        r["pid"] for r in http.get(f"/system/replicas/{name}").json() if r["state"] != "stopping"
    ]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_killed_replica_is_reported_unready_then_replaced_and_serving(http: httpx.Client) -> None:
    assert http.post("/system/functions", json=echo_body("victim")).status_code == 202
    wait_until(lambda: available(http, "victim") == 1)
    [pid] = _pids(http, "victim")
    assert http.get("/function/victim").json()["pid"] == pid

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: available(http, "victim") == 0, timeout=10, interval=0.02)
    assert http.get("/system/function/victim").json()["replicas"] == 1  # still desired

    wait_until(lambda: available(http, "victim") == 1)
    [new_pid] = _pids(http, "victim")
    assert new_pid != pid
    r = http.post("/function/victim", content=b"after")
    assert r.status_code == 200 and r.content == b"after"
    assert http.get("/function/victim").json()["pid"] == new_pid
    http.request("DELETE", "/system/functions", json={"functionName": "victim"})


def test_scale_min_label_starts_replicas_and_scaling_starts_and_stops_processes(
    http: httpx.Client,
) -> None:
    labels = {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "3"}
    assert (
        http.post("/system/functions", json=echo_body("scaler", labels=labels)).status_code == 202
    )
    wait_until(lambda: available(http, "scaler") == 2)
    assert len(set(_pids(http, "scaler"))) == 2

    assert http.post("/system/scale-function/scaler", json={"replicas": 3}).status_code == 202
    wait_until(lambda: available(http, "scaler") == 3)
    pids = _pids(http, "scaler")
    seen = {http.get("/function/scaler").json()["hostname"] for _ in range(40)}
    assert seen <= {"scaler-0", "scaler-1", "scaler-2"} and len(seen) >= 2  # random choice

    assert http.post("/system/scale-function/scaler", json={"replicas": 1}).status_code == 202
    wait_until(lambda: available(http, "scaler") == 1)
    wait_until(lambda: sum(not _gone(p) for p in pids) == 1)

    assert (
        http.request("DELETE", "/system/functions", json={"functionName": "scaler"}).status_code
        == 202
    )
    wait_until(lambda: all(_gone(p) for p in pids))


def test_update_rolls_replicas_to_the_new_spec(http: httpx.Client) -> None:
    assert http.post("/system/functions", json=echo_body("roller")).status_code == 202
    wait_until(lambda: available(http, "roller") == 1)
    [old] = _pids(http, "roller")
    body = echo_body("roller", envVars={"exec_timeout": "5s", "NEW_VAR": "1"})
    assert http.put("/system/functions", json=body).status_code == 202
    wait_until(lambda: _pids(http, "roller") != [old] and available(http, "roller") == 1)
    wait_until(lambda: _gone(old))
    assert http.get("/system/function/roller").json()["envVars"]["NEW_VAR"] == "1"
    assert http.post("/function/roller", content=b"v2").content == b"v2"
    http.request("DELETE", "/system/functions", json={"functionName": "roller"})


def test_handler_is_a_package_so_relative_imports_work_and_errors_are_500(
    http: httpx.Client, tmp_path: Path
) -> None:
    fdir = tmp_path / "pkgfn"
    fdir.mkdir()
    (fdir / "helper.py").write_text("def shout(b):\n    return b.upper()\n")
    (fdir / "handler.py").write_text(
        "from .helper import shout\n\n"
        "def handle(event, context):\n"
        "    if event.path == '/boom':\n"
        "        raise RuntimeError('boom')\n"
        "    if event.path == '/headers':\n"
        "        print('headers asked', flush=True)\n"
        "        return {'body': {k.lower(): event.headers[k] for k in event.headers}}\n"
        "    if event.path == '/stream':\n"
        "        return (c for c in [b'a', 'b', b'c'])\n"
        "    return {'statusCode': 201, 'body': shout(event.body), 'headers': {'X-Hdr': event.headers['x-in']}}\n"
    )
    body = echo_body("pkgfn", annotations={"com.fedfaas.handler": str(fdir)})
    assert http.post("/system/functions", json=body).status_code == 202
    wait_until(lambda: available(http, "pkgfn") == 1)
    r = http.post("/function/pkgfn", content=b"abc", headers={"X-In": "yes"})
    assert (r.status_code, r.content, r.headers["x-hdr"]) == (201, b"ABC", "yes")
    r = http.get("/function/pkgfn/boom")
    assert r.status_code == 500 and r.headers["x-openfaas-internal"] == "of-watchdog"
    assert http.get("/function/pkgfn/stream").content == b"abc"
    logs = http.get("/system/logs", params={"name": "pkgfn"}).text
    assert "RuntimeError: boom" in logs

    # the proxy's headers reach the function; hop-by-hop ones do not
    with http.stream(
        "GET", "/system/logs", params={"name": "pkgfn", "follow": "true", "tail": "0"}
    ) as f:
        seen = http.get(
            "/function/pkgfn/headers", headers={"X-Call-Id": "c1", "Connection": "close"}
        )
        line = next(f.iter_lines())
    assert "headers asked" in line
    hdrs = seen.json()
    assert hdrs["x-call-id"] == "c1" and int(hdrs["x-start-time"]) > 0
    assert hdrs["x-forwarded-for"] == "127.0.0.1" and hdrs["x-forwarded-host"].startswith(
        "127.0.0.1:"
    )
    assert hdrs.get("connection") != "close"
    http.request("DELETE", "/system/functions", json={"functionName": "pkgfn"})


def test_crash_looping_replica_is_restarted_with_backoff_and_never_ready(
    http: httpx.Client, runtime: RuntimeProcess, tmp_path: Path
) -> None:
    fdir = tmp_path / "crash"
    fdir.mkdir()
    (fdir / "handler.py").write_text("raise SystemExit(3)\n")
    body = echo_body("crasher", annotations={"com.fedfaas.handler": str(fdir)})
    assert http.post("/system/functions", json=body).status_code == 202
    exits = re.compile(r"crasher-0 \(pid \d+\) exited with code 3")
    wait_until(lambda: len(exits.findall(runtime.log_path.read_text())) >= 3)  # 2 restarts
    st = http.get("/system/function/crasher").json()
    assert st["replicas"] == 1 and "availableReplicas" not in st
    assert http.post("/function/crasher", content=b"x").status_code == 503
    assert http.get("/healthz").status_code == 200
    http.request("DELETE", "/system/functions", json={"functionName": "crasher"})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_replica_outlives_the_runtime(tmp_path: Path, sig: signal.Signals) -> None:
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt").start()
    try:
        with_function_token(rt)
        with client(rt) as http:
            labels = {"com.openfaas.scale.min": "2"}
            assert (
                http.post("/system/functions", json=echo_body("orphan", labels=labels)).status_code
                == 202
            )
            wait_until(lambda: available(http, "orphan") == 2)
            pids = _pids(http, "orphan")
        assert rt.pid is not None
        os.kill(rt.pid, sig)
        rt.proc.wait(30)  # type: ignore[union-attr]
        wait_until(lambda: all(_gone(p) for p in pids), timeout=15)
    finally:
        rt.stop()


@pytest.mark.slow  # over 10 s: `make test-slow`
def test_hung_replica_is_marked_unready_then_replaced(tmp_path: Path) -> None:
    env = {
        "FEDFAAS_RUNTIME_HEALTH_TIMEOUT": "0.3",
        "FEDFAAS_RUNTIME_FAILURE_THRESHOLD": "3",
        "FEDFAAS_RUNTIME_STOP_GRACE": "2",
        "FEDFAAS_RUNTIME_HEALTH_INTERVAL": "0.2",
    }
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt", env=env).start()
    try:
        with_function_token(rt)
        with client(rt) as http:
            assert http.post("/system/functions", json=echo_body("hung")).status_code == 202
            wait_until(lambda: available(http, "hung") == 1)
            [pid] = _pids(http, "hung")
            os.kill(pid, signal.SIGSTOP)  # alive but not answering
            wait_until(lambda: available(http, "hung") == 0)
            wait_until(lambda: available(http, "hung") == 1 and _pids(http, "hung") != [pid])
            wait_until(lambda: _gone(pid))
            assert http.post("/function/hung", content=b"ok").content == b"ok"
    finally:
        rt.stop()
