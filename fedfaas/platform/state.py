"""The platform's record of itself: ``STATE_DIR/state.json`` (plain JSON, written atomically).

Layout of the state folder::

    state.json      what runs: PIDs, start times, ports, addresses, eBPF probe (this module)
    secrets/        basic-auth-*, tokens, minio-root-*, the components' MinIO and Redis users
                    (minio-<user>.json, redis-<user>.json); all mode 0600, the folder 0700
    data/<part>/    the parts' own data (MinIO objects, Redis append-only file)
    run/<part>/     the parts' runtime state (the embedded runtime's state folder)
    logs/<part>.log stdout and stderr of each part

``down`` removes everything but ``logs/`` (kept so that a failed start can be read);
``down --purge`` removes the folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedfaas.platform.errors import StateDirError

STATE_FILE = "state.json"
LOGS = "logs"
FORMAT = 1


@dataclass
class ServiceRecord:
    """One started part: how to recognise its process and where it listens."""

    name: str
    pid: int
    create_time: float
    ports: dict[str, int]
    address: str
    log: str
    extra: dict[str, str] = field(default_factory=dict)
    #: the kernel's start of the process (:func:`fedfaas.platform.procs.start_ticks`), which no
    #: clock change moves; 0 in records written before it was kept
    start_ticks: int = 0

    def alive(self) -> bool:
        """The recorded process runs (the same one: its PID was not reused)."""
        from fedfaas.platform.procs import is_alive

        return is_alive(self.pid, self.create_time, self.start_ticks)


@dataclass
class PlatformState:
    """Everything ``status`` and ``down`` need, as recorded by ``up``."""

    state_dir: str
    platform_id: str
    host: str
    stack_file: str
    started_at: float
    ports: dict[str, int] = field(default_factory=dict)
    services: list[ServiceRecord] = field(default_factory=list)
    format: int = FORMAT
    #: the memory file system of the gateways' object stores (``down`` removes them there)
    shm_dir: str = "/dev/shm"
    #: ``bpf.probe()`` once the parts are up: the machine does not change while they run, and a
    #: probe compiles and loads a BPF program (seconds), too slow to repeat on every ``status``.
    ebpf: list[str] = field(default_factory=list)
    #: ``fedfaas up`` without ``--no-tls``: the parts serve HTTPS (:mod:`fedfaas.platform.pki`)
    tls: bool = False

    def record(self, name: str) -> ServiceRecord | None:
        return next((s for s in self.services if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlatformState:
        services = [ServiceRecord(**s) for s in data.pop("services", [])]
        return cls(**data, services=services)


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def load(state_dir: Path) -> PlatformState | None:
    """The recorded state, or ``None`` when nothing was started from this folder."""
    path = state_path(state_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateDirError(
            f"cannot read {path}: {exc}; remove it if no fedfaas process runs from {state_dir}"
        ) from exc
    if data.get("format") != FORMAT:
        raise StateDirError(
            f"{path} has format {data.get('format')!r}, expected {FORMAT}; "
            f"stop its processes by hand and remove it"
        )
    try:
        return PlatformState.from_json(data)
    except TypeError as exc:
        raise StateDirError(f"{path} is not a fedfaas state file: {exc}") from exc


def save(state: PlatformState) -> None:
    """Write ``state.json`` atomically (write a temporary file, then rename)."""
    path = state_path(Path(state.state_dir))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def prepare_dir(state_dir: Path) -> None:
    """Create the state folder (mode 0700) or fail clearly if it cannot be one."""
    if state_dir.exists() and not state_dir.is_dir():
        raise StateDirError(f"state folder {state_dir} exists and is not a folder")
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (state_dir / LOGS).mkdir(exist_ok=True)
    except OSError as exc:
        raise StateDirError(f"cannot create state folder {state_dir}: {exc}") from exc
    if not os.access(state_dir, os.W_OK):
        raise StateDirError(f"state folder {state_dir} is not writable")


@contextmanager
def locked(state_dir: Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive lock on the state folder, so two `up`/`down` never interleave.

    ``wait_s``: how long to wait for another holder (the supervisor restarting a part holds
    it for a moment) before :class:`StateDirError`.
    """
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as exc:
                if time.monotonic() >= deadline:
                    raise StateDirError(
                        f"another fedfaas command is working on {state_dir}; wait for it to finish"
                    ) from exc
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def clean(state_dir: Path, *, keep_logs: bool = True) -> None:
    """Remove everything the platform left in ``state_dir`` (but ``logs/`` when asked)."""
    if not state_dir.exists():
        return
    if not keep_logs:
        shutil.rmtree(state_dir)
        return
    for entry in state_dir.iterdir():
        if entry.name == LOGS:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def leftovers(state_dir: Path) -> list[str]:
    """Names in ``state_dir`` other than ``logs/`` (empty when the folder is clean)."""
    if not state_dir.exists():
        return []
    return sorted(e.name for e in state_dir.iterdir() if e.name != LOGS)
