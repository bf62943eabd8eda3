"""Start the runtime as a child process (for ``fedfaas up`` and the tests)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fedfaas.services import ServiceError, free_port

log = logging.getLogger(__name__)


@dataclass
class RuntimeProcess:
    """``python -m fedfaas.runtime`` in its own process group, log in ``<state_dir>/runtime.log``.

    Examples
    --------
    >>> rt = RuntimeProcess(stack=Path("stack.yml"), state_dir=Path(".state/runtime")).start()
    >>> rt.url  # doctest: +SKIP
    'http://127.0.0.1:41234'
    >>> rt.stop()  # doctest: +SKIP
    """

    stack: Path | None = None
    state_dir: Path = Path(".state/runtime")
    auth_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.state_dir / "runtime.log"

    def start(self, timeout: float = 30.0) -> RuntimeProcess:
        """Spawn the runtime and wait until ``/healthz`` answers 200."""
        self.port = self.port or free_port(self.host)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "fedfaas.runtime",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.extra_args,
        ]
        if self.stack is not None:
            argv += ["--stack", str(self.stack)]
        if self.auth_dir is not None:
            argv += ["--auth-dir", str(self.auth_dir)]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"runtime exited with code {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        log.info("runtime on %s (pid %d)", self.url, self.proc.pid)
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise ServiceError(
            f"runtime not healthy on {self.url} after {timeout:.0f}s; see {self.log_path}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the runtime stops its replicas first), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "runtime (pid %d) did not stop in %.0fs; SIGKILL", self.proc.pid, timeout
                )
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        self.proc = None
