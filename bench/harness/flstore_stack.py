"""Start the FLStore serving side as child processes on loopback (tests, benchmarks, demos).

:class:`FLStoreStack` starts the embedded OpenFaaS runtime, the cache engine and the request
tracker against a given Redis and MinIO, each in its own process group, and stops them by PID.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fedfaas.services import free_port, wait_for_port

log = logging.getLogger(__name__)
_REPO = Path(__file__).resolve().parent.parent


@dataclass
class Child:
    """One child process in its own session, log in a file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=_REPO,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(_REPO), **self.env},
            )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass


@dataclass
class FLStoreStack:
    """Runtime + cache engine + request tracker for one Redis and one MinIO.

    Parameters
    ----------
    workdir
        Folder for state and logs.
    redis_url, minio_endpoint, minio_access_key, minio_secret_key
        Backing services (already running).
    engine_args, tracker_args
        Extra command-line arguments of the engine and the tracker.
    """

    workdir: Path
    redis_url: str
    minio_endpoint: str
    minio_access_key: str
    minio_secret_key: str
    engine_args: list[str] = field(default_factory=list)
    tracker_args: list[str] = field(default_factory=list)
    engine_env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    children: list[Child] = field(default_factory=list)
    runtime_port: int = 0
    engine_port: int = 0
    tracker_port: int = 0

    @property
    def runtime_url(self) -> str:
        return f"http://{self.host}:{self.runtime_port}"

    @property
    def engine_url(self) -> str:
        return f"http://{self.host}:{self.engine_port}"

    @property
    def tracker_url(self) -> str:
        return f"http://{self.host}:{self.tracker_port}"

    def start(self, timeout: float = 60.0) -> FLStoreStack:
        py = sys.executable
        self.runtime_port = free_port()
        self.engine_port = free_port()
        self.tracker_port = free_port()
        logs = self.workdir / "logs"
        specs = [
            (
                "runtime",
                [
                    py,
                    "-m",
                    "fedfaas.runtime",
                    "--host",
                    self.host,
                    "--port",
                    str(self.runtime_port),
                    "--state-dir",
                    str(self.workdir / "runtime"),
                    "--log-level",
                    "warning",
                ],
                self.runtime_port,
                {},
            ),
            (
                "engine",
                [
                    py,
                    "-m",
                    "cache_engine",
                    "--host",
                    self.host,
                    "--port",
                    str(self.engine_port),
                    "--redis",
                    self.redis_url,
                    "--minio",
                    self.minio_endpoint,
                    "--minio-access-key",
                    self.minio_access_key,
                    "--minio-secret-key",
                    self.minio_secret_key,
                    "--runtime",
                    self.runtime_url,
                    *self.engine_args,
                ],
                self.engine_port,
                self.engine_env,
            ),
            (
                "tracker",
                [
                    py,
                    "-m",
                    "request_tracker",
                    "--host",
                    self.host,
                    "--port",
                    str(self.tracker_port),
                    "--redis",
                    self.redis_url,
                    "--engine",
                    self.engine_url,
                    "--runtime",
                    self.runtime_url,
                    *self.tracker_args,
                ],
                self.tracker_port,
                {},
            ),
        ]
        try:
            for name, argv, port, env in specs:
                c = Child(name, argv, logs / f"{name}.log", env).start()
                self.children.append(c)
                wait_for_port(self.host, port, timeout, c.proc)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for c in reversed(self.children):  # tracker, engine, then the runtime and its replicas
            c.stop()
        self.children.clear()

    def logs(self) -> str:
        out = []
        for p in sorted((self.workdir / "logs").glob("*.log")):
            out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until the engine has no background work (prefetch, eviction, restoration)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(f"{self.engine_url}/v1/idle", timeout=10).json()["idle"]:
                return
            time.sleep(0.05)
        raise TimeoutError("engine still busy")

    def ingest(self, job: str, rounds: Any) -> None:
        for r in rounds:
            resp = httpx.post(f"{self.engine_url}/v1/jobs/{job}/rounds/{r}/complete", timeout=120)
            resp.raise_for_status()
