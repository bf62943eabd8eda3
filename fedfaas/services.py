"""Real backing services (Redis, MinIO) as child processes on loopback.

Used by ``fedfaas up`` and by the test fixtures alike, so that what the tests exercise is
exactly what the platform runs. Each server takes a free loopback port unless one is given,
keeps its data under a folder of its own, and is stopped by PID (process group) on ``stop``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))


class ServiceError(RuntimeError):
    """A backing service could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(
    host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until ``host:port`` accepts TCP connections, or raise ``ServiceError``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceError(
                f"process exited with code {proc.returncode} before listening on {port}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServiceError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


def http_ok(url: str, timeout: float = 1.0, headers: dict[str, str] | None = None) -> bool:
    """True when a GET of ``url`` answers 200 right now (no retries)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def redis_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis server on ``host:port`` answers ``PING`` with ``+PONG`` right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def find_binary(name: str) -> str | None:
    """Find ``name`` on PATH or in the FedFaaS cache (where setup builds MinIO)."""
    found = shutil.which(name)
    if found:
        return found
    for cand in (
        CACHE_DIR / "bin" / name,
        CACHE_DIR / "gobin" / name,
        Path("/usr/sbin") / name,
        Path("/usr/bin") / name,
    ):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def spawn(
    argv: list[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session (and process group) of its own, output appended to a log file.

    The one way FedFaaS starts a child process: the backing servers, the runtime, each function
    replica and the platform's daemons. Their own session means a signal to the parent's group
    (Ctrl-C in a terminal) does not reach them, and :func:`stop_group` stops the child together
    with whatever it started. The log file is closed in this process once the child holds it.

    Parameters
    ----------
    argv:
        Command line.
    log_path:
        stdout and stderr are appended here (its folder is created).
    env:
        The child's whole environment (default: this process's).
    cwd:
        Working folder (default: this process's).
    pass_fds:
        File descriptors the child inherits (all others are closed).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ if env is None else env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM the process group led by ``proc``, SIGKILL it after ``timeout`` s; reap ``proc``.

    Returns the exit code, or ``None`` if the process survived SIGKILL for 5 seconds.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not stop in %.0fs; SIGKILL", proc.pid, timeout)
    # the leader may be gone while members of its group (its children) are not
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        log.error("pid %d survived SIGKILL", proc.pid)
        return None


@dataclass
class ChildProcess:
    """A child process in its own process group, with its log in a file; see :func:`spawn`."""

    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, kw_only=True)

    def _spawn(
        self,
        argv: list[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        self.proc = spawn(argv, log_path=log_path, env={**os.environ, **(env or {})}, cwd=cwd)
        return self.proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc is not None:
            stop_group(self.proc, timeout)
        self.proc = None


@dataclass
class _Server(ChildProcess):
    """A backing server on ``host:port`` keeping its data (and ``server.log``) in ``data_dir``."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0

    def _start(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(argv, self.data_dir / "server.log", env)


@dataclass
class RedisServer(_Server):
    """Debian's ``redis-server`` on a loopback port, persistence in ``data_dir``."""

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        """The ``redis-server`` command line for this host, port and data folder."""
        binary = find_binary("redis-server")
        if binary is None:
            raise ServiceError(
                "redis-server not found: run `make setup` (apt-get install redis-server)"
            )
        return [
            binary,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
        ]

    def ping(self, timeout: float = 1.0) -> bool:
        """True when the server answers ``PING`` with ``PONG`` right now."""
        return redis_ping(self.host, self.port, timeout)

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.port = self.port or free_port(self.host)
        self._start(self.command())
        wait_for_port(self.host, self.port, timeout, self.proc)
        log.info("redis on %s:%d (pid %s)", self.host, self.port, self.pid)
        return self


@dataclass
class MinioServer(_Server):
    """The real MinIO server on a loopback port, with its console on another."""

    console_port: int = 0
    access_key: str = "fedfaas"
    secret_key: str = "fedfaas-secret-key"

    @property
    def endpoint(self) -> str:
        """``host:port`` as the MinIO client wants it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def console_url(self) -> str:
        return f"http://{self.host}:{self.console_port}"

    def command(self) -> list[str]:
        """The ``minio server`` command line (API and console both on ``host``)."""
        binary = find_binary("minio")
        if binary is None:
            raise ServiceError(
                "minio not found on PATH or in ~/.cache/fedfaas/bin: run `make setup` "
                "(go install github.com/minio/minio@latest)"
            )
        return [
            binary,
            "server",
            str(self.data_dir / "data"),
            "--address",
            f"{self.host}:{self.port}",
            "--console-address",
            f"{self.host}:{self.console_port}",
            "--quiet",
        ]

    def environment(self) -> dict[str, str]:
        """Environment for the server: root credentials, console on, no update checks."""
        return {
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "on",
            "MINIO_UPDATE": "off",
        }

    def ready(self, timeout: float = 1.0) -> bool:
        """True when ``/minio/health/ready`` answers 200 right now."""
        return http_ok(f"{self.url}/minio/health/ready", timeout)

    def start(self, timeout: float = 60.0) -> MinioServer:
        self.port = self.port or free_port(self.host)
        self.console_port = self.console_port or free_port(self.host)
        self._start(self.command(), env=self.environment())
        wait_for_port(self.host, self.port, timeout, self.proc)
        self._wait_ready(timeout)
        log.info("minio on %s (console %s, pid %s)", self.url, self.console_url, self.pid)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(
                    f"minio exited with code {self.proc.returncode}; see "
                    f"{self.data_dir / 'server.log'}"
                )
            time.sleep(0.1)
        raise ServiceError(f"minio at {self.url} not ready after {timeout:.0f}s")
