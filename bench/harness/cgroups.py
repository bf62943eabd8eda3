"""Accounting by cgroup (v1): one group per side of a benchmark, measured alike on every side.

A :class:`Cgroup` is a folder of the same name under this process's own group in each of the
``memory``, ``cpuacct`` and ``cpuset`` hierarchies (``/sys/fs/cgroup/<controller>/...``, the
cgroup v1 layout these machines mount), so the limits of the group the benchmark runs in still
hold for everything in it. What it gives:

- **processes in it from their first page:** :meth:`Cgroup.spawning` moves the calling *thread*
  into the group for the block (cgroup v1 takes thread ids in ``tasks``), so every process
  started from that thread meanwhile (``subprocess.Popen``, whatever helper calls it) is forked
  inside the group, and so are all the children those processes fork later; :meth:`Cgroup.add`
  moves a process that already runs;
- **memory:** the group's peak (``memory.max_usage_in_bytes``, reset by :meth:`Cgroup.reset_peak`
  as a window opens). The kernel charges every page once, to the group of the process that
  touched it first: anonymous memory, page cache, and the tmpfs pages of ``/dev/shm``, which a
  sampled per-process RSS counts once per process mapping them;
- **CPU:** ``cpuacct.usage``, the CPU-seconds every thread of the group ran, read at both ends
  of a window;
- **the same CPUs:** ``cpuset.cpus`` (``cpus``, default the parent's), ``cpuset.mems`` copied
  from the parent;
- **threads:** :class:`ThreadSampler` reads the group's ``tasks`` over a window: the most
  threads alive at once and how many of them were scheduled at all (their context switches
  grew);
- **removal:** :meth:`Cgroup.close` (also on leaving a ``with`` block, whatever happened in it)
  kills what is still in the group, or moves it back to the parent, and removes the folders.

:class:`Window` bundles the three figures of one group over one window.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
#: the hierarchies a group is made in
CONTROLLERS = ("memory", "cpuacct", "cpuset")


class CgroupError(RuntimeError):
    """A group could not be made, entered or removed: the message says which file and why."""


# ----------------------------------------------------------------------------- pure helpers
def parse_cpus(spec: str) -> list[int]:
    """The CPU numbers of a cpuset list such as ``"0"``, ``"0-1"`` or ``"0,2-3"`` (sorted,
    unique). Raises ``ValueError`` with what is wrong for anything else."""
    cpus: set[int] = set()
    text = spec.strip()
    if not text:
        raise ValueError("an empty CPU list")
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{spec!r}: {part!r} is not a CPU number or a range 'a-b'")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"{spec!r}: the range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def own_paths(pid: int | str = "self") -> dict[str, str]:
    """The group of process ``pid`` in each v1 hierarchy: controller -> path (``/proc/PID/cgroup``)."""
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(","):
                if ctrl:
                    out[ctrl] = path
    return out


def unavailable(root: Path = ROOT) -> str | None:
    """Why groups cannot be made here (not root, a controller not mounted as cgroup v1), or
    None when they can."""
    if os.geteuid() != 0:
        return "cgroup accounting needs root (it writes under /sys/fs/cgroup)"
    own = own_paths()
    for ctrl in CONTROLLERS:
        if ctrl not in own or not (root / ctrl / "tasks").is_file():
            return f"the cgroup v1 {ctrl} controller is not mounted at {root / ctrl}"
    return None


def groups_named(prefix: str, root: Path = ROOT) -> list[Path]:
    """The folders of groups under this process's own whose names start with ``prefix``, in
    every hierarchy of :data:`CONTROLLERS` (what a run left behind, if anything)."""
    own = own_paths()
    return sorted(
        path for c in CONTROLLERS for path in (root / c / own[c].lstrip("/")).glob(f"{prefix}*")
    )


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"writing {value!r} to {path}: {exc}") from exc


def _ids(path: Path) -> list[int]:
    """The ids listed in a ``tasks`` or ``cgroup.procs`` file ([] when the group is gone)."""
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


# ----------------------------------------------------------------------------- the group
class Cgroup:
    """One group named ``name`` under this process's own group in every hierarchy of
    :data:`CONTROLLERS` (module docstring). ``cpus``: its ``cpuset.cpus`` (a subset of the
    parent's, :func:`parse_cpus` syntax; default: the parent's).

    Raises :class:`CgroupError` when a folder exists already (another run's, or a name used
    twice) or cannot be set up; what was made by then is removed first.
    """

    def __init__(self, name: str, *, cpus: str | None = None, root: Path = ROOT) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"{name!r} is not a group name")
        own = own_paths()
        self.name = name
        self.dirs = {c: root / c / own[c].lstrip("/") / name for c in CONTROLLERS}
        self._closed = False
        made: list[Path] = []
        try:
            for path in self.dirs.values():
                try:
                    path.mkdir()
                except OSError as exc:
                    raise CgroupError(f"making {path}: {exc}") from exc
                made.append(path)
            self._set_cpuset(cpus)
        except BaseException:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            self._closed = True
            raise

    def _set_cpuset(self, cpus: str | None) -> None:
        here = self.dirs["cpuset"]
        parent_cpus = (here.parent / "cpuset.cpus").read_text().strip()
        if cpus is not None:
            extra = set(parse_cpus(cpus)) - set(parse_cpus(parent_cpus))
            if extra:
                raise CgroupError(
                    f"CPUs {sorted(extra)} are not in this process's cpuset ({parent_cpus})"
                )
        # a v1 cpuset takes no task before both are set
        _write(here / "cpuset.mems", (here.parent / "cpuset.mems").read_text().strip())
        _write(here / "cpuset.cpus", parent_cpus if cpus is None else cpus)

    # -- what it holds ---------------------------------------------------------------------
    @property
    def cpus(self) -> str:
        """The group's ``cpuset.cpus`` as the kernel reads it back."""
        return (self.dirs["cpuset"] / "cpuset.cpus").read_text().strip()

    def pids(self) -> list[int]:
        """The processes in the group now (``cgroup.procs`` of its memory group)."""
        return _ids(self.dirs["memory"] / "cgroup.procs")

    def tids(self) -> list[int]:
        """The threads in the group now (``tasks`` of its cpuacct group)."""
        return _ids(self.dirs["cpuacct"] / "tasks")

    # -- putting processes in --------------------------------------------------------------
    @contextlib.contextmanager
    def spawning(self) -> Iterator[Cgroup]:
        """Run the block with the calling thread in the group: every process it starts is born
        there (its first page charged to the group), and their children after them. The
        thread goes back to its own groups on leaving, whatever happened."""
        tid = threading.get_native_id()
        moved: list[str] = []
        try:
            for ctrl, path in self.dirs.items():
                _write(path / "tasks", str(tid))
                moved.append(ctrl)
            yield self
        finally:
            for ctrl in moved:
                _write(self.dirs[ctrl].parent / "tasks", str(tid))

    def add(self, pid: int) -> None:
        """Move running process ``pid`` (all its threads) into the group; the pages it
        touched before stay charged where they were."""
        for path in self.dirs.values():
            _write(path / "cgroup.procs", str(pid))

    # -- figures ---------------------------------------------------------------------------
    def _memory(self, name: str) -> int:
        return int((self.dirs["memory"] / name).read_text())

    def memory_bytes(self) -> int:
        """The memory charged to the group now (``memory.usage_in_bytes``)."""
        return self._memory("memory.usage_in_bytes")

    def reset_peak(self) -> None:
        """Start the peak again from the group's usage now."""
        _write(self.dirs["memory"] / "memory.max_usage_in_bytes", "0")

    def peak_bytes(self) -> int:
        """The most memory charged to the group since it was made or :meth:`reset_peak`."""
        return self._memory("memory.max_usage_in_bytes")

    def cpu_ns(self) -> int:
        """CPU time the group's threads have run, in ns (``cpuacct.usage``)."""
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text())

    # -- the end ---------------------------------------------------------------------------
    def close(self, *, kill: bool = True, timeout: float = 15.0) -> None:
        """Empty the group and remove its folders (safe to call twice).

        ``kill``: SIGKILL every process still in it (a benchmark's processes are stopped by
        then; one left over is a leak); else move them back to the parent group. Tries for up
        to ``timeout`` s (a killed process leaves its group once it has exited; a folder is
        busy until then); raises :class:`CgroupError` if a folder cannot be removed by then."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        left = dict(self.dirs)
        while True:
            for pid in sorted({p for path in left.values() for p in _ids(path / "cgroup.procs")}):
                with contextlib.suppress(ProcessLookupError, CgroupError):
                    if kill:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        for path in self.dirs.values():
                            _write(path.parent / "cgroup.procs", str(pid))
            errors = {}
            for ctrl, path in list(left.items()):
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    errors[ctrl] = f"{path}: {exc}"
                    continue
                del left[ctrl]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self._closed = True
        if errors:
            raise CgroupError(
                f"could not remove {'; '.join(errors.values())} (processes still in it: "
                f"{self.pids()})"
            )

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- threads
def context_switches(tid: int) -> int | None:
    """Voluntary + involuntary context switches of thread ``tid`` (None when it is gone)."""
    total = 0
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                    total += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return total


class ThreadSampler(threading.Thread):
    """The threads of a group over a window, sampled every ``period`` s from :meth:`start` to
    :meth:`stop`: ``threads_max``, the most alive at once; ``threads_ran``, how many distinct
    threads were scheduled in the window (context switches grew between their first and last
    sample, or a thread born in the window had run); ``samples``."""

    def __init__(self, group: Cgroup, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.group, self.period = group, period
        self.threads_max = 0
        self.samples = 0
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._born: set[int] = set()
        self._halt = threading.Event()

    def sample(self) -> None:
        tids = self.group.tids()
        self.threads_max = max(self.threads_max, len(tids))
        for tid in tids:
            n = context_switches(tid)
            if n is None:
                continue
            if tid not in self._first:
                self._first[tid] = n
                if self.samples:
                    self._born.add(tid)
            self._last[tid] = n
        self.samples += 1

    @property
    def threads_ran(self) -> int:
        return sum(
            1
            for tid, n in self._last.items()
            if n > self._first[tid] or (tid in self._born and n > 0)
        )

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.period)

    def stop(self) -> None:
        """One last sample, then stop."""
        if self.is_alive():
            self._halt.set()
            self.join(5)
            self.sample()


class Window:
    """One group's figures over one window: :meth:`start` resets the peak, reads the CPU
    counter and starts a :class:`ThreadSampler` (unless ``threads`` is False); :meth:`stop`
    returns ``{"peak_bytes", "idle_bytes", "cpu_s", "cpus"}`` and with the sampler
    ``"threads_max", "threads_ran", "thread_samples", "thread_sample_period_s"``
    (``idle_bytes``: the group's usage as the window opened)."""

    def __init__(self, group: Cgroup, period: float = 0.02, *, threads: bool = True) -> None:
        self.group = group
        self.threads = ThreadSampler(group, period) if threads else None
        self._cpu0 = 0
        self._idle = 0

    def start(self) -> Window:
        self._idle = self.group.memory_bytes()
        self.group.reset_peak()
        self._cpu0 = self.group.cpu_ns()
        if self.threads is not None:
            self.threads.start()
        return self

    def stop(self) -> dict[str, Any]:
        cpu = self.group.cpu_ns() - self._cpu0
        peak = self.group.peak_bytes()
        out = {"peak_bytes": peak, "idle_bytes": self._idle, "cpu_s": cpu / 1e9}
        if self.threads is not None:
            self.threads.stop()
            out |= {
                "threads_max": self.threads.threads_max,
                "threads_ran": self.threads.threads_ran,
                "thread_samples": self.threads.samples,
                "thread_sample_period_s": self.threads.period,
            }
        return {**out, "cpus": self.group.cpus}


# ----------------------------------------------------------------------------- one round's sides
@contextlib.contextmanager
def born_in(group: Cgroup | None) -> Iterator[None]:
    """Processes started in the block are born in ``group`` (nothing changes for None)."""
    if group is None:
        yield
        return
    with group.spawning():
        yield


def client_cpus(parent: str, server: str | None) -> str | None:
    """The clients' CPUs beside a server side pinned to ``server`` in a parent group of CPUs
    ``parent`` (both :func:`parse_cpus` syntax): the parent's CPUs the server does not have,
    so that no system's clients take CPU time from its server (on one machine, the nearest
    thing to clients on machines of their own); None (the parent's, shared with the server)
    when the server has them all or is not pinned."""
    if server is None:
        return None
    rest = sorted(set(parse_cpus(parent)) - set(parse_cpus(server)))
    return ",".join(str(c) for c in rest) or None


class RoundGroups:
    """The two groups of one system's round: ``server`` (every server-side process, pinned to
    ``cpus``) and ``clients`` (the client processes, on the parent's CPUs that ``cpus`` leaves,
    :func:`client_cpus`; on all of them when it leaves none), named ``<prefix>-server`` and
    ``<prefix>-clients``. :meth:`open_window` starts a :class:`Window` on both;
    :meth:`close_window` returns ``{"server": ..., "clients": ...}`` (each with its ``cpus``);
    :meth:`close` removes both groups (also on leaving a ``with`` block)."""

    def __init__(self, prefix: str, cpus: str | None = None) -> None:
        self.server = Cgroup(f"{prefix}-server", cpus=cpus)
        try:
            parent = (self.server.dirs["cpuset"].parent / "cpuset.cpus").read_text().strip()
            self.clients = Cgroup(f"{prefix}-clients", cpus=client_cpus(parent, cpus))
        except BaseException:
            self.server.close()
            raise
        self._windows: dict[str, Window] = {}

    def open_window(self) -> None:
        # the clients' threads are not sampled: no figure uses them, and reading every thread
        # of hundreds (Flower 1.42 runs three processes per client) every 20 ms took CPU
        # time from the systems measured
        self._windows = {
            "server": Window(self.server).start(),
            "clients": Window(self.clients, threads=False).start(),
        }

    def close_window(self) -> dict[str, Any]:
        return {side: w.stop() for side, w in self._windows.items()}

    def close(self, timeout: float = 15.0) -> None:
        """Remove both groups (:meth:`Cgroup.close`, each given ``timeout`` s)."""
        try:
            self.server.close(timeout=timeout)
        finally:
            self.clients.close(timeout=timeout)

    def __enter__(self) -> RoundGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
