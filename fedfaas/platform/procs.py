"""Daemon processes: start them in their own session, recognise them later, stop them for good.

A process is known by its PID *and* its start, so that a PID reused by the kernel after a
reboot or a crash is never mistaken for (or killed as) one of ours. The start is the kernel's
count of clock ticks since boot (``/proc/<pid>/stat``), which nothing changes: the wall-clock
start time that psutil reports is that count plus the boot time of ``/proc/stat``, a whole
second that moves when the system clock is adjusted, so the same process could seem to have
started a second later than recorded (and a platform's parts all seem dead to ``down`` and to
the supervisor). The wall-clock time is kept beside it, for records that have no count.

``down`` stops a platform by its records (:func:`stop_tree`) and then sweeps what is left
(:func:`marked`): every process whose environment carries the platform's id (children inherit
it) or whose working folder is one of the platform's own (``redis-server`` overwrites its
environment with its process title, its working folder stays), pass after pass until none is
left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from core.services import spawn

log = logging.getLogger(__name__)

#: how far apart two wall-clock start times of one process may be when no tick count is known:
#: the boot time they are computed from is a whole second, which moves with the system clock
WALL_CLOCK_SLACK_S = 1.5
#: how long a process killed with SIGKILL may take to be gone (one that held gigabytes of
#: memory takes a while to give it back)
KILL_WAIT_S = 30.0

# Popen objects of the daemons this process started, so that it can reap them (no zombies when
# `up` and `down` run in one process, as in the smoke run) and Python does not warn about them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_EXIT_CODES: dict[int, int] = {}


def spawn_daemon(
    argv: list[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None = None
) -> tuple[int, float, int]:
    """Start ``argv`` with :func:`core.services.spawn` and remember it to reap it later.

    Returns
    -------
    (pid, create_time, start_ticks)
        The PID, the wall-clock start time and the kernel's start (:func:`start_ticks`) of
        the process, which together identify it.
    """
    proc = spawn(argv, log_path=log_path, env=env, cwd=cwd)
    _CHILDREN[proc.pid] = proc
    _EXIT_CODES.pop(proc.pid, None)
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:  # exited already: the readiness check reports it with the log
        created = 0.0
    log.debug("started pid %d: %s", proc.pid, " ".join(argv))
    return proc.pid, created, start_ticks(proc.pid) or 0


def start_ticks(pid: int) -> int | None:
    """The clock tick since boot at which ``pid`` started (``/proc/<pid>/stat``, field 22),
    None when there is no such process. It never changes for a process, whatever the clock."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces and parentheses
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _reap(pid: int) -> None:
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        _EXIT_CODES[pid] = proc.returncode
        del _CHILDREN[pid]


def is_alive(pid: int, create_time: float | None = None, ticks: int | None = None) -> bool:
    """True when ``pid`` runs, is not a zombie, and is the process that started at ``ticks``
    (:func:`start_ticks`; when given) or else at wall-clock ``create_time`` (when given, give
    or take :data:`WALL_CLOCK_SLACK_S`)."""
    if pid <= 0:
        return False
    _reap(pid)
    try:
        p = psutil.Process(pid)
        if ticks:
            if start_ticks(pid) != ticks:
                return False
        elif create_time and abs(p.create_time() - create_time) > WALL_CLOCK_SLACK_S:
            return False
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def exit_code(pid: int) -> int | None:
    """The exit code of a daemon started by this process, if it has exited."""
    _reap(pid)
    return _EXIT_CODES.get(pid)


def descendants(
    pid: int, create_time: float | None = None, ticks: int | None = None
) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (replicas of the runtime, workers of a server)."""
    if not is_alive(pid, create_time, ticks):
        return []
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _live(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        _reap(p.pid)
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def stop_tree(
    pid: int, create_time: float | None, timeout: float, ticks: int | None = None
) -> list[int]:
    """Stop a daemon, its process group and every descendant: SIGTERM, wait, then SIGKILL.

    Like systemd's control-group kill: SIGTERM goes to the group and to every descendant at
    once (replicas may live in sessions of their own); they get ``timeout`` seconds to exit
    cleanly. Whatever is left, in the group or below the daemon, is killed.

    Returns
    -------
    list of int
        PIDs still alive after SIGKILL (empty when everything is gone).
    """
    if not is_alive(pid, create_time, ticks):
        return []
    try:
        family = [psutil.Process(pid), *descendants(pid, create_time, ticks)]
    except psutil.NoSuchProcess:  # exited since the check
        return []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)  # the daemon leads its own session and group
    # one SIGTERM each: a second one tells a part (the node gateway) to give up its clean stop
    _signal_all(_outside_group(family, pid), signal.SIGTERM)
    _wait_gone(family, timeout)
    # children started after the snapshot, or in sessions of their own
    family = _live([*family, *descendants(pid, create_time, ticks)])
    if family:
        log.warning(
            "pids %s ignored SIGTERM for %.0fs; sending SIGKILL", [p.pid for p in family], timeout
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _signal_all(family, signal.SIGKILL)
        _wait_gone(family, KILL_WAIT_S)
    return [p.pid for p in _live(family)]


def marked(var: str, value: str, folders: Iterable[Path] = ()) -> list[psutil.Process]:
    """Live processes whose environment has ``var=value``, or whose working folder is inside
    one of ``folders``.

    Every daemon of a platform gets the platform's id in its environment, and children inherit
    it; this finds them even when their parent died and they were re-parented to init. A
    process that wiped its environment (``redis-server`` writes its process title over it) is
    found by its working folder: give the folders only the platform's parts work in (a shell
    that sits in one keeps its environment, and is not taken). This process and its ancestors
    are never among them.
    """
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    roots = [str(Path(f).resolve()) for f in folders]
    found = []
    for p in psutil.process_iter():
        if p.pid in mine:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        env = _environ(p)
        if env.get(var) == value or (not env and roots and _inside(_cwd(p), roots)):
            found.append(p)
    return found


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return dict(p.environ())
    except psutil.Error:
        return {}


def _cwd(p: psutil.Process) -> str:
    try:
        return str(p.cwd())
    except psutil.Error:
        return ""


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def kill_all(procs: list[psutil.Process], timeout: float) -> list[int]:
    """SIGTERM ``procs``, wait up to ``timeout``, SIGKILL the rest; PIDs still alive after it."""
    _signal_all(procs, signal.SIGTERM)
    _wait_gone(procs, timeout)
    rest = _live(procs)
    if rest:
        _signal_all(rest, signal.SIGKILL)
        _wait_gone(rest, KILL_WAIT_S)
    return [p.pid for p in _live(rest)]


def _outside_group(procs: Iterable[psutil.Process], pgid: int) -> list[psutil.Process]:
    """The processes of ``procs`` that ``killpg(pgid)`` does not reach."""
    out = []
    for p in procs:
        try:
            if os.getpgid(p.pid) != pgid:
                out.append(p)
        except ProcessLookupError:
            continue
    return out


def _signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            child = _CHILDREN.get(p.pid)
            if child is not None:
                child.poll()
        if not _live(procs):
            return
        time.sleep(0.05)


def port_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound right now (nothing listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
