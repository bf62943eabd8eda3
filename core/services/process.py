"""Child processes on loopback: free ports, readiness probes, spawning and stopping by process
group, and the base of every backing server (:class:`Server`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)


CACHE_DIR = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))


class ServiceError(RuntimeError):
    """A backing service could not be found, started or reached."""


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


PORT_RANGE_ENV = "FEDFAAS_PORT_RANGE"


def port_range() -> tuple[int, int]:
    """The ports :func:`free_port` draws from: ``[first, end)``.

    By default the 12,288 ports just below the kernel's ephemeral range. ``FEDFAAS_PORT_RANGE``
    (``"FIRST-LAST"``, inclusive) narrows it, so that processes choosing ports at the same time
    (the test suite's parallel workers, each with a range of its own, and every process they
    start) never draw the same port between the choice and the bind.
    """
    low = _ephemeral_low()
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return max(1024, low - 12288), low
    try:
        first_s, last_s = spec.split("-")
        first, last = int(first_s), int(last_s)
    except ValueError:
        raise ServiceError(
            f"{PORT_RANGE_ENV}={spec!r}: expected FIRST-LAST, e.g. 20000-25999"
        ) from None
    if not 1024 <= first <= last <= 65535:
        raise ServiceError(f"{PORT_RANGE_ENV}={spec!r}: need 1024 <= FIRST <= LAST <= 65535")
    return first, last + 1


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now, drawn from :func:`port_range`.

    A port the kernel handed out itself (``bind(0)``) lies in the range it also draws the source
    ports of outgoing connections from: between the choice and the server's own bind, any
    connection on the machine can take it, and the server fails with EADDRINUSE (seen in CI:
    ``fedfaas up``'s gateway lost its port to a connection made while functions deployed). A
    port below that range is taken only by someone binding it on purpose.
    """
    first, end = port_range()
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(first, end) if end > first else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all tried were busy
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bound_free_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound, not listening, to a port :func:`free_port` drew: connections to it are
    refused as to a free port, and no other process can take the port until it is closed."""
    for _ in range(64):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, free_port(host)))
        except OSError:  # drawn free, taken before this bind: draw again
            s.close()
            continue
        return s
    raise ServiceError(f"no port drawn free on {host} stayed free until it was bound")


class PortRangeFull(ServiceError):
    """The free-port range holds fewer free ports than :func:`free_ports` was asked for."""

    def __init__(self, needed: int, found: int, first: int, last: int) -> None:
        self.needed, self.found, self.first, self.last = needed, found, first, last
        super().__init__(f"needed {needed} free ports and {first}-{last} holds {found}")


def _shuffled(first: int, end: int, rng: random.Random) -> Iterator[int]:
    """The ports of ``[first, end)`` in random order, each once (Fisher-Yates, drawn lazily:
    a few draws cost a few steps, not a shuffle of the whole range)."""
    size = end - first
    moved: dict[int, int] = {}
    for i in range(size):
        j = rng.randrange(i, size)
        yield first + moved.get(j, j)
        moved[j] = moved.get(i, i)


def free_ports(
    n: int, host: str = "127.0.0.1", *, exclude: Iterable[int] = (), strict: bool = False
) -> list[int]:
    """``n`` different ports, each free on ``host`` right now and none in ``exclude``, drawn at
    random from :func:`port_range`.

    Two draws of :func:`free_port` can answer the same port (nothing holds the first between
    them): each port drawn here stays bound until the last is drawn, so no draw answers it
    again, and the range is tried port by port at most once. A range with fewer free ports than
    ``n`` (too narrow or too busy): with ``strict``, :class:`PortRangeFull`; without, the
    kernel's own ports (``bind(0)``) make up the rest.
    """
    if n <= 0:
        return []
    first, end = port_range()
    skip = set(exclude)
    held: list[socket.socket] = []
    passed_over: list[socket.socket] = []  # kernel ports in ``exclude``, held so as not to recur
    try:
        for port in _shuffled(first, end, random.SystemRandom()):
            if len(held) >= n:
                break
            if port in skip:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n and strict:
            raise PortRangeFull(n, len(held), first, end - 1)
        while len(held) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            (passed_over if s.getsockname()[1] in skip else held).append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held + passed_over:
            s.close()


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
    """True when a Redis server on ``host:port`` answers an unauthenticated ``PING`` right now:
    with ``+PONG``, or (a server that needs a user, as FedFaaS's do) with ``-NOAUTH``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
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
        The child's whole environment (default: this process's), plus
        ``PYTHONFAULTHANDLER=1`` unless it sets that: a Python child that dies of a signal
        (a C extension's segfault) leaves its threads' tracebacks in its log.
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
            env={"PYTHONFAULTHANDLER": "1", **(os.environ if env is None else env)},
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
class Server(ChildProcess):
    """A backing server on ``host:port`` keeping its data (and ``server.log``) in ``data_dir``."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def _start(
        self, argv: list[str], ready: Callable[[], None], env: dict[str, str] | None = None
    ) -> None:
        """Spawn ``argv``, then ``ready()`` (it raises unless the server serves); a start that
        fails there (its port taken, not ready in time, a bad configuration, Ctrl-C) stops the
        server before the error goes up, so it leaves no process behind (one did in CI)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(argv, self.log_path, env)
        try:
            ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, name: str, probe: Callable[[], bool], timeout: float) -> None:
        """Poll ``probe`` until it holds; :class:`ServiceError` when the server exits first
        (with the end of its log, which says why) or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while not probe():
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(
                    f"{name} exited with code {self.proc.returncode}: "
                    f"{self._log_tail()} (see {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"{name} on {self.host}:{self.port} not ready after {timeout:g}s"
                )
            time.sleep(0.1)

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log"
        return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())


def write_once(path: Path, value: str) -> None:
    """Create ``path`` (mode 0600) holding ``value`` unless it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(value)


def secrets_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
