"""Processes the demo starts: node gateways, the embedded runtime, aggregator functions."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fedfaas.services import MinioServer, ServiceError
from fedfaas.services import free_port as free_port_for

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
AGGREGATOR_DIR = REPO / "functions" / "aggregator"


@dataclass
class Child:
    """A process the demo started, in its own session, with its output in a log file."""

    name: str
    proc: subprocess.Popen[bytes]

    @classmethod
    def spawn(cls, name: str, argv: list[str], logfile: Path, cwd: Path) -> Child:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        log.info("%s started (pid %d), log %s", name, proc.pid, logfile)
        return cls(name, proc)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def stop_all(children: list[Child]) -> None:
    for c in children:
        c.stop()


def wait_http(url: str, timeout: float, child: Child | None = None) -> None:
    """Wait until ``url`` answers 200, or raise ``ServiceError`` (also if ``child`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise ServiceError(
                f"{child.name} exited with {child.proc.returncode} before answering {url}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise ServiceError(f"{url} did not answer within {timeout:.0f}s")


def start_gateways(
    base: Path, names: list[str], redis_url: str, minio: MinioServer, shm_root: Path, spawn: int
) -> tuple[dict[str, str], list[Child]]:
    secret = secrets.token_hex(32)
    ports = {n: free_port_for() for n in names}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    children = []
    for n in names:
        sd = base / f"gateway-{n}"
        sd.mkdir(parents=True, exist_ok=True)
        fd = os.open(sd / "admin-secret", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")  # every node shares the admin secret, hence the tokens
        argv = [
            sys.executable,
            "-m",
            "gateway",
            "--node",
            n,
            "--port",
            str(ports[n]),
            "--state-dir",
            str(sd),
            "--redis",
            redis_url,
            "--shm-root",
            str(shm_root),
            "--minio",
            minio.endpoint,
            "--log-level",
            "WARNING",
        ]
        for other in names:
            if other != n:
                argv += ["--peer", f"{other}={urls[other]}"]
        if spawn:
            argv += ["--spawn-aggregators", str(spawn)]
        children.append(Child.spawn(f"gateway-{n}", argv, sd / "gateway.log", cwd=REPO))
    for n, c in zip(names, children, strict=True):
        wait_http(f"{urls[n]}/healthz", 60, c)
    (base / "admin-token").write_text(secret + "\n")
    os.chmod(base / "admin-token", 0o600)
    return urls, children


def start_runtime(base: Path) -> tuple[str, Child]:
    port = free_port_for()
    sd = base / "runtime"
    argv = [
        sys.executable,
        "-m",
        "fedfaas.runtime",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--state-dir",
        str(sd),
        "--log-level",
        "warning",
    ]
    if (REPO / "stack.yml").exists():
        argv += ["--stack", str(REPO / "stack.yml")]
    sd.mkdir(parents=True, exist_ok=True)
    child = Child.spawn("runtime", argv, sd / "runtime.log", cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", 60, child)
    return url, child


def deploy_aggregator(runtime: str, name: str, env: dict[str, str], timeout: float) -> None:
    body = {
        "service": name,
        "image": "fedfaas/aggregator:demo",
        "envVars": env,
        "annotations": {"com.fedfaas.handler": str(AGGREGATOR_DIR)},
        "labels": {"com.openfaas.scale.min": "1"},
    }
    with httpx.Client(base_url=runtime, timeout=30) as http:
        r = http.post("/system/functions", json=body)
        if r.status_code >= 300:
            raise ServiceError(f"deploying {name}: {r.status_code} {r.text[:300]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = http.get(f"/system/function/{name}")
            if st.status_code == 200 and int(st.json().get("availableReplicas", 0)) >= 1:
                return
            time.sleep(0.2)
    raise ServiceError(f"function {name} had no ready replica after {timeout:.0f}s")


def remove_functions(runtime: str, names: list[str]) -> None:
    with httpx.Client(base_url=runtime, timeout=30) as http:
        for n in names:
            with contextlib.suppress(httpx.HTTPError):
                http.request("DELETE", "/system/functions", json={"functionName": n})


def job_on(url: str, job: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/v1/jobs/{job}", timeout=10)
        if r.status_code == 200:
            body: dict[str, Any] = r.json()
            return body
        if time.monotonic() > deadline:
            raise ServiceError(f"job {job} did not appear on {url}: {r.status_code} {r.text}")
        time.sleep(0.1)
