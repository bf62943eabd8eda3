"""Start the runtime as a child process (for the tests and scripts; ``fedfaas up`` runs it as a
platform part)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.services import ChildProcess, ServiceError, free_port, http_ok
from core.stackfile import PLATFORM_STACK
from runtime.auth import BasicAuth
from runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)


@dataclass
class RuntimeProcess(ChildProcess):
    """``python -m runtime`` in its own process group, log in ``<state_dir>/runtime.log``.

    ``settings`` holds further :class:`RuntimeSettings` (``{"ready_wait": 2}``).

    Basic auth on ``/system/*`` is always on: :meth:`start` keeps the credentials in
    :attr:`auth_dir` (``<state_dir>/auth``, folder 0700, files 0600), making a user ``admin``
    with a random password where the files do not exist yet (write them first to choose), and
    :attr:`auth` is the ``(user, password)`` pair a caller sends.

    Examples
    --------
    >>> rt = RuntimeProcess(stack=Path("stack.yml"), state_dir=Path(".state/runtime")).start()
    >>> rt.url  # doctest: +SKIP
    'http://127.0.0.1:41234'
    >>> httpx.get(f"{rt.url}/system/functions", auth=rt.auth)  # doctest: +SKIP
    <Response [200 OK]>
    >>> rt.stop()  # doctest: +SKIP
    """

    stack: Path | None = None
    #: the platform's functions (the aggregator) resolve too, as under ``fedfaas up``
    platform_stack: Path | None = PLATFORM_STACK
    state_dir: Path = Path(".state/runtime")
    host: str = "127.0.0.1"
    port: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.get("tls_cert_file") else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "runtime.log"

    @property
    def auth_dir(self) -> Path:
        """The folder with ``basic-auth-user`` and ``basic-auth-password``."""
        return self.state_dir / "auth"

    @property
    def auth(self) -> tuple[str, str]:
        """``(user, password)`` of ``/system/*``, from :attr:`auth_dir` (after :meth:`start`)."""
        creds = BasicAuth.from_dir(self.auth_dir)
        return creds.user, creds.password

    def start(self, timeout: float = 30.0) -> RuntimeProcess:
        """Spawn the runtime and wait until ``/healthz`` answers 200.

        Raises
        ------
        ServiceError
            The runtime exited, or was not healthy within ``timeout`` seconds (it is stopped).
        """
        self.port = self.port or free_port(self.host)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        BasicAuth.ensure_dir(self.auth_dir)
        argv = RuntimeSettings(
            host=self.host,
            port=self.port,
            state_dir=self.state_dir,
            stack=self.stack,
            platform_stack=self.platform_stack,
            auth_dir=self.auth_dir,
            **self.settings,
        ).to_argv()
        proc = self._spawn(argv, self.log_path, self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.proc = None
                raise ServiceError(
                    f"runtime exited with code {proc.returncode}; see {self.log_path}"
                )
            if http_ok(f"{self.url}/healthz"):
                log.info("runtime on %s (pid %d)", self.url, proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise ServiceError(
            f"runtime not healthy on {self.url} after {timeout:.0f}s; see {self.log_path}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the runtime stops its replicas first), then SIGKILL after ``timeout``."""
        super().stop(timeout)
