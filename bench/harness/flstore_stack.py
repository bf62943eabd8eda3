"""Start the FLStore serving side as child processes on loopback (tests, benchmarks).

:class:`FLStoreStack` starts the embedded OpenFaaS runtime, the cache engine and the request
tracker against a given Redis and MinIO, each in its own process group, and stops them by PID.
Every command line is rendered by the component's settings class
(:class:`~runtime.settings.RuntimeSettings`,
:class:`~cache_engine.settings.EngineSettings`,
:class:`~request_tracker.settings.TrackerSettings`); MinIO's keys reach the engine through its
environment, never its command line.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cache_engine.settings import EngineSettings
from core.auth import bearer, write_token_file
from core.cmdline import CommandLineSettings
from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS
from core.services import ChildProcess, MinioServer, RedisServer, free_ports, wait_for_port
from request_tracker.settings import TrackerSettings
from runtime.process import RuntimeProcess

log = logging.getLogger(__name__)
_REPO = Path(__file__).resolve().parents[2]
_S = TypeVar("_S", bound=CommandLineSettings)


@dataclass
class Child(ChildProcess):
    """One child process in its own process group, log in a file, listening on ``port``.

    ``env`` is added to this process's environment; the child runs in the repository root with
    it on ``PYTHONPATH``.
    """

    name: str
    argv: list[str]
    log_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"

    def start(self, timeout: float = 60.0) -> Child:
        """Spawn the process and wait until its port accepts connections (stopped if not)."""
        self._spawn(self.argv, self.log_path, {"PYTHONPATH": str(_REPO), **self.env}, _REPO)
        try:
            wait_for_port(self.host, self.port, timeout, self.proc)
        except Exception:
            self.stop()
            raise
        log.info("%s on %s:%d (pid %s)", self.name, self.host, self.port, self.pid)
        return self


def _settings(cls: type[_S], fixed: dict[str, Any], overrides: Mapping[str, Any]) -> _S:
    """``cls(**fixed, **overrides)``, refusing a name ``cls`` has no setting for (its
    ``extra="ignore"`` would drop a misspelt one silently)."""
    unknown = sorted(set(overrides) - set(cls.model_fields))
    if unknown:
        raise ValueError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}")
    return cls(**{**fixed, **overrides})


@dataclass
class FLStoreStack:
    """Runtime + cache engine + request tracker for one Redis and one MinIO.

    Parameters
    ----------
    workdir
        Folder for state and logs.
    redis, minio
        Backing services (already running); the engine and the tracker log in with their own
        users' credentials files (:meth:`RedisServer.credentials_file`,
        :meth:`MinioServer.credentials_file`).
    engine_settings, tracker_settings
        Further :class:`~cache_engine.settings.EngineSettings` and
        :class:`~request_tracker.settings.TrackerSettings` (``{"secondaries": 1}``); the
        addresses are the stack's own.
    """

    workdir: Path
    redis: RedisServer
    minio: MinioServer
    engine_settings: dict[str, Any] = field(default_factory=dict)
    tracker_settings: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    runtime: RuntimeProcess | None = None
    children: list[Child] = field(default_factory=list)
    engine_port: int = 0
    tracker_port: int = 0

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def runtime_url(self) -> str:
        assert self.runtime is not None, "stack not started"
        return self.runtime.url

    @property
    def engine_url(self) -> str:
        return f"http://{self.host}:{self.engine_port}"

    @property
    def tracker_url(self) -> str:
        return f"http://{self.host}:{self.tracker_port}"

    def token_file(self, scope: str) -> Path:
        """The stack's token file of ``scope`` (admin, analyst, service, function), 0600 in
        workdir; the function token is also the runtime secret ``fedfaas-function-token``."""
        return self.workdir / "secrets" / f"{scope}-token"

    def token(self, scope: str) -> str:
        """The bearer token of ``scope``."""
        return self.token_file(scope).read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        """The admin ``Authorization`` header (every route of the engine and the tracker)."""
        return bearer(self.token("admin"))

    @property
    def function_auth(self) -> dict[str, str]:
        """The ``Authorization`` header the cache functions require."""
        return bearer(self.token("function"))

    def start(self, timeout: float = 60.0) -> FLStoreStack:
        """Start the runtime, then the engine, then the tracker; all stopped if one fails."""
        # two different ports: two separate draws could be one port
        self.engine_port, self.tracker_port = free_ports(2, self.host)
        logs = self.workdir / "logs"
        for scope in ("admin", "analyst", "service", "function"):
            if not self.token_file(scope).exists():
                write_token_file(self.token_file(scope), secrets.token_urlsafe(24))
        try:
            self.runtime = RuntimeProcess(state_dir=self.workdir / "runtime", host=self.host)
            self.runtime.start(timeout)
            # the cache functions are deployed with it
            with OpenFaaS(self.runtime_url, self.runtime.auth) as gw:
                gw.set_secret(FUNCTION_TOKEN_SECRET, self.token("function"))
            engine = _settings(
                EngineSettings,
                {
                    "host": self.host,
                    "port": self.engine_port,
                    "redis_url": self.redis_url,
                    "redis_credentials_file": self.redis.credentials_file("cache-engine"),
                    "minio_endpoint": self.minio.endpoint,
                    "minio_credentials_file": self.minio.credentials_file("cache-engine"),
                    "runtime_url": self.runtime_url,
                    "runtime_auth_dir": str(self.runtime.auth_dir),
                    "admin_token_file": self.token_file("admin"),
                    "service_token_file": self.token_file("service"),
                    "function_token_file": self.token_file("function"),
                },
                self.engine_settings,
            )
            tracker = _settings(
                TrackerSettings,
                {
                    "host": self.host,
                    "port": self.tracker_port,
                    "redis_url": self.redis_url,
                    "redis_credentials_file": self.redis.credentials_file("request-tracker"),
                    "engine_url": self.engine_url,
                    "runtime_url": self.runtime_url,
                    "admin_token_file": self.token_file("admin"),
                    "analyst_token_file": self.token_file("analyst"),
                    "engine_token_file": self.token_file("service"),
                    "function_token_file": self.token_file("function"),
                },
                self.tracker_settings,
            )
            for name, argv, port in (
                ("engine", engine.to_argv(), self.engine_port),
                ("tracker", tracker.to_argv(), self.tracker_port),
            ):
                child = Child(name, argv, logs / f"{name}.log", port, host=self.host)
                self.children.append(child)
                child.start(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the tracker, the engine, then the runtime and its replicas."""
        for c in reversed(self.children):
            c.stop()
        self.children.clear()
        if self.runtime is not None:
            self.runtime.stop()

    def logs(self) -> str:
        """The last 3,000 characters of every log of the stack."""
        paths = sorted((self.workdir / "logs").glob("*.log"))
        if self.runtime is not None and self.runtime.log_path.exists():
            paths.append(self.runtime.log_path)
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in paths)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until the tracker has told the engine every query it answered on a kept plan
        (a tracker that does not answer is not waited for), and the engine has no background
        work (prefetch, eviction, restoration)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                told = (
                    "flstore_tracker_touches_pending 0\n"
                    in httpx.get(f"{self.tracker_url}/metrics", timeout=10, headers=self.auth).text
                )
            except httpx.TransportError:
                told = True
            if (
                told
                and httpx.get(f"{self.engine_url}/v1/idle", timeout=10, headers=self.auth).json()[
                    "idle"
                ]
            ):
                return
            time.sleep(0.05)
        raise TimeoutError("engine still busy")

    def ingest(self, job: str, rounds: Any) -> None:
        """Tell the engine that ``rounds`` of ``job`` were written to the cold store."""
        for r in rounds:
            url = f"{self.engine_url}/v1/jobs/{job}/rounds/{r}/complete"
            resp = httpx.post(url, timeout=120, headers=self.auth)
            resp.raise_for_status()
