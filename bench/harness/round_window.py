"""One FL round measured the same way for FedFaaS and Flower: window, memory, failures, guard.

Both sides of a comparison use these helpers, so a row compares like with like:

- **window** (:func:`window_s`): from the first client's "trained weights in memory as arrays"
  mark (before it serialises anything) to "global model available" on the server; the
  **server-only** window starts when the server's TCP port has received the first
  ``FIRST_BYTES_THRESHOLD`` bytes of updates, seen by :class:`FirstBytes` in the kernel's
  per-socket counters (``sock_diag`` netlink, ``tcpi_bytes_received``, polled every 2 ms), the
  same way for any server whatever its language or RPC stack;
- **memory** (:class:`PeakMemory`, :func:`unique_rss`): the server side's memory with every
  page counted once, sampled every 5 ms over the window, its peak: each process's private
  and file pages (``RssAnon`` + ``RssFile``) plus the pages of a shared-memory store once
  (tmpfs blocks of its files), not once per process that maps them. Beside it, the bound
  :func:`reset_hwm` / :func:`summed_hwm` give: every server-side process (and child) has its
  ``VmHWM`` reset as the window opens, and the figure is the sum of each one's ``VmHWM`` read
  at the end; a page mapped by two processes (the store's arena in the gateway and an
  aggregator) counts twice there, so it is an upper bound;
- **guard** (:func:`guard_decision`, :class:`MemoryGuard`): a point is stopped when the
  server side's summed ``VmRSS`` passes a limit or the machine's ``MemAvailable`` falls under
  a floor; the point is then recorded as a failure (:func:`failure`) with the sizes seen, not
  raised, so a benchmark records "killed at N GB" and goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

#: bytes received on the server port past its idle value that count as "updates started to arrive"
FIRST_BYTES_THRESHOLD = 64 << 10
#: kill a point when the machine has less than this available (default floor)
DEFAULT_FLOOR_BYTES = 2 << 30


# ----------------------------------------------------------------------------- pure logic
def window_s(starts_ns: Iterable[int], end_ns: int) -> float:
    """Seconds from the earliest start mark to ``end_ns`` (all ``time.monotonic_ns``).

    Raises ``ValueError`` for no start marks, a zero (missing) mark, or an end before the
    first start (the marks then belong to different clocks or rounds).
    """
    marks = list(starts_ns)
    if not marks:
        raise ValueError("no start marks")
    if min(marks) <= 0 or end_ns <= 0:
        raise ValueError(f"missing mark: starts {min(marks)}, end {end_ns}")
    first = min(marks)
    if end_ns < first:
        raise ValueError(f"end {end_ns} before the first start {first}")
    return (end_ns - first) / 1e9


def guard_decision(
    server_rss: int, available: int, *, limit_bytes: int, floor_bytes: int
) -> str | None:
    """Why a point must be stopped now, or None: the server side's summed RSS is over
    ``limit_bytes`` (0: no limit), or the machine's available memory is under ``floor_bytes``."""
    if limit_bytes and server_rss > limit_bytes:
        return f"server RSS {server_rss / 1e9:.2f} GB over the limit {limit_bytes / 1e9:.2f} GB"
    if available < floor_bytes:
        return (
            f"machine memory available {available / 1e9:.2f} GB under the floor "
            f"{floor_bytes / 1e9:.2f} GB"
        )
    return None


def failure(kind: str, detail: str, **sizes: Any) -> dict[str, Any]:
    """A point that did not finish, as a result: ``{"ok": False, "failure": kind, "detail",
    ...sizes}``. ``kind`` is one of ``killed`` (memory guard), ``error`` (the system under test
    failed: a crash, a refused message, an error answer) or ``timeout``."""
    if kind not in ("killed", "error", "timeout"):
        raise ValueError(f"unknown failure kind {kind!r}")
    return {"ok": False, "failure": kind, "detail": detail, **sizes}


def killed_at(record: dict[str, Any]) -> str:
    """Short label of a failure for tables and plots, by what stopped the point (``cause``):
    ``killed at 16.20 GB`` (the server over the limit), ``killed: machine low, server 0.30 GB,
    clients 19.00 GB`` (the floor), ``killed by SIGKILL, server ...`` (the OOM killer, most
    likely); ``error`` or ``timeout`` otherwise; empty for a point that finished."""
    if record.get("ok", True):
        return ""
    if record["failure"] != "killed":
        return str(record["failure"])
    server = f"{record.get('server_rss_bytes', 0) / 1e9:.2f} GB"
    clients = f"{record.get('client_rss_bytes', 0) / 1e9:.2f} GB"
    cause = record.get("cause", "limit")
    if cause == "floor":
        return f"killed: machine low, server {server}, clients {clients}"
    if cause == "sigkill":
        return f"killed by SIGKILL, server {server}, clients {clients}"
    return f"killed at {server}"


# ----------------------------------------------------------------------------- /proc readers
def children_map() -> dict[int, list[int]]:
    """Every process's children, from one pass over ``/proc/<pid>/stat`` (its parent)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(pids: Iterable[int]) -> list[int]:
    """The given processes that are alive and all their descendants, sorted: one pass over
    ``/proc`` whatever the number of roots (the watchers call it every few ms with a root per
    client: a walk of every process per root made the watching cost grow with clients x
    processes, on the CPUs the measured systems run on)."""
    roots = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    if not roots:
        return []
    kids = children_map()
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += kids.get(pid, [])
    return sorted(seen)


def status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``, ``VmRSS``) in bytes; 0 if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def summed_hwm(pids: Iterable[int]) -> dict[str, Any]:
    """``{"bytes": sum of VmHWM, "processes": n, "per_process": {pid: bytes}}`` over the trees
    of ``pids``; call it at the end of the round, while every process still runs."""
    per = {pid: status_bytes(pid, "VmHWM") for pid in tree(pids)}
    return {"bytes": sum(per.values()), "processes": len(per), "per_process": per}


def reset_hwm(pids: Iterable[int]) -> int:
    """Reset ``VmHWM`` to the current ``VmRSS`` in every process of the trees of ``pids``
    (``echo 5 > /proc/<pid>/clear_refs``), so that the ``VmHWM`` read at the end is the peak
    of the window that starts now, not of the set-up before it (a model sent to the clients,
    a job created). Returns how many processes were reset; raises ``OSError`` when this
    process may not reset one that is alive (the window's memory would then be wrong)."""
    n = 0
    for pid in tree(pids):
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            n += 1
        except FileNotFoundError:  # exited meanwhile
            pass
    return n


def tmpfs_bytes(roots: Iterable[Path]) -> int:
    """Memory held by the files under ``roots`` on a tmpfs (allocated blocks, not sizes)."""
    total = 0
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def unique_rss(pids: Iterable[int], store_roots: Sequence[Path] = (), *, walk: bool = True) -> int:
    """The processes' memory with every page counted once: each one's ``RssAnon`` and
    ``RssFile``, plus :func:`tmpfs_bytes` of ``store_roots`` (the shared-memory pages every
    process of the store maps, in their ``RssShmem``). With no roots, each process's
    ``RssShmem`` is counted as its own. ``walk``: the processes and their descendants
    (:func:`tree`); False: ``pids`` as given (the caller has walked)."""
    fields = ("RssAnon", "RssFile") if store_roots else ("RssAnon", "RssFile", "RssShmem")
    total = 0
    for pid in tree(pids) if walk else pids:
        total += sum(status_bytes(pid, f) for f in fields)
    return total + tmpfs_bytes(store_roots)


class PeakMemory(threading.Thread):
    """The peak of :func:`unique_rss` over the server side, sampled every ``period`` s from
    :meth:`start` to :meth:`stop`. The processes (``server_pids()`` and their descendants,
    :func:`tree`: replicas come and go) are walked again every ``walk_period`` s, not at every
    sample: the walk reads every process of the machine, and the sampler shares the CPUs with
    the systems it measures. :attr:`rate_hz`: the samples it took per second (short of
    ``1 / period`` on a busy machine)."""

    def __init__(
        self,
        server_pids: Callable[[], Iterable[int]],
        store_roots: Sequence[Path] = (),
        period: float = 0.005,
        walk_period: float = 0.1,
    ) -> None:
        super().__init__(daemon=True)
        self.server_pids, self.store_roots, self.period = server_pids, store_roots, period
        self.walk_period = walk_period
        self.peak_bytes = 0
        self.samples = 0
        self._t0_ns = 0
        self._t1_ns = 0
        self._pids: list[int] = []
        self._walked_ns = 0
        self._halt = threading.Event()

    @property
    def rate_hz(self) -> float | None:
        """Samples per second between the first and the last (None before two)."""
        if self.samples < 2 or self._t1_ns <= self._t0_ns:
            return None
        return (self.samples - 1) / ((self._t1_ns - self._t0_ns) / 1e9)

    def sample(self) -> int:
        t = time.monotonic_ns()
        if not self._walked_ns or t - self._walked_ns >= self.walk_period * 1e9:
            self._pids, self._walked_ns = tree(self.server_pids()), t
        now = unique_rss(self._pids, self.store_roots, walk=False)
        self._t1_ns = time.monotonic_ns()
        if not self.samples:
            self._t0_ns = self._t1_ns
        self.peak_bytes = max(self.peak_bytes, now)
        self.samples += 1
        return now

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.period)

    def stop(self) -> int:
        """Stop sampling (one last sample first); returns the peak."""
        if self.is_alive():
            self.sample()
            self._halt.set()
            self.join(5)
        return self.peak_bytes


def sampled_memory(
    peak: PeakMemory | None, hwm: dict[str, Any], idle_bytes: int, guard: MemoryGuard | None
) -> dict[str, Any]:
    """A round record's sampled memory figures, alike for every system: the sampled peak with
    its sample count and rate, the summed ``VmHWM`` (:func:`summed_hwm`) and its process
    count, the server's RSS before the window and the guard's highest RSS sample."""
    return {
        "server_peak_bytes": peak.peak_bytes if peak is not None else 0,
        "server_peak_samples": peak.samples if peak is not None else 0,
        "server_peak_sample_hz": peak.rate_hz if peak is not None else None,
        "server_hwm_bytes": hwm["bytes"],
        "server_processes": hwm["processes"],
        "server_idle_rss_bytes": idle_bytes,
        "server_rss_sampled_bytes": guard.peak_server_rss if guard is not None else 0,
    }


def server_peak(rec: dict[str, Any]) -> float | None:
    """A round record's server peak memory: its server cgroup's peak where the round was
    measured by cgroup (``cgroup.server.peak_bytes``), else the sampled peak with every page
    once (``server_peak_bytes``), or in records stored before that the summed ``VmHWM``;
    None when it has none."""
    group = (rec.get("cgroup") or {}).get("server") or {}
    v = group.get("peak_bytes") or rec.get("server_peak_bytes") or rec.get("server_hwm_bytes")
    return float(v) if v else None


def summed_rss(pids: Iterable[int]) -> int:
    return sum(status_bytes(pid, "VmRSS") for pid in tree(pids))


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# sock_diag netlink (linux/sock_diag.h, linux/inet_diag.h); tcpi_bytes_received is the u64 at
# offset 128 of struct tcp_info (linux/tcp.h, kernel >= 4.1)
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
INET_DIAG_INFO = 2
TCPI_BYTES_RECEIVED = 128


def tcp_bytes_received(port: int) -> dict[int, int]:
    """Server-side TCP sockets of local port ``port`` (IPv4 and IPv6): cookie -> bytes received."""
    out: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
        for family in (socket.AF_INET, socket.AF_INET6):
            sockid = struct.pack("!HH", port, 0) + b"\0" * 32 + struct.pack("=I", 0) + b"\xff" * 8
            req = (
                struct.pack(
                    "=BBBBI",
                    family,
                    socket.IPPROTO_TCP,
                    1 << (INET_DIAG_INFO - 1),
                    0,
                    0xFFFFFFFF & ~(1 << 6),  # every state but TIME_WAIT (no tcp_info)
                )
                + sockid
            )
            hdr = struct.pack(
                "=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
            )
            s.send(hdr + req)
            done = False
            while not done:
                data = s.recv(1 << 20)
                pos = 0
                while pos + 16 <= len(data):
                    ln, typ, _fl, _seq, _pid = struct.unpack_from("=IHHII", data, pos)
                    if typ in (NLMSG_DONE, NLMSG_ERROR):
                        done = True
                        break
                    body = pos + 16
                    sport = struct.unpack_from("!H", data, body + 4)[0]
                    if sport == port:
                        cookie = struct.unpack_from("=Q", data, body + 4 + 40)[0]
                        a = body + 72
                        while a + 4 <= pos + ln:
                            alen, atyp = struct.unpack_from("=HH", data, a)
                            if alen < 4:
                                break
                            if atyp == INET_DIAG_INFO and alen - 4 >= TCPI_BYTES_RECEIVED + 8:
                                out[cookie] = struct.unpack_from(
                                    "=Q", data, a + 4 + TCPI_BYTES_RECEIVED
                                )[0]
                            a += (alen + 3) & ~3
                    pos += (ln + 3) & ~3
    return out


# ----------------------------------------------------------------------------- watchers
def server_window_s(first_ns: int, end_ns: int) -> float | None:
    """Seconds from a :class:`FirstBytes` mark ``first_ns`` to ``end_ns`` (None when the
    threshold was never seen, ``first_ns`` 0).

    The poll that sees the threshold comes up to one period (plus its own read) after the bytes
    did; when a round ends within that lag (a small model on a loaded machine) the end mark is
    earlier than the poll's and the window is shorter than the resolution: 0, not an error."""
    if not first_ns:
        return None
    return window_s([min(first_ns, end_ns)], end_ns)


class FirstBytes(threading.Thread):
    """When the server starts receiving an update: ``t_ns`` (``time.monotonic_ns``) of the first
    poll at which the TCP sockets of the server's ``port`` have received ``threshold`` bytes
    more than at :meth:`start` (the kernel's ``tcpi_bytes_received`` of each socket, new
    sockets from 0; :func:`tcp_bytes_received`); 0 until then. Polls every ``period`` s
    (resolution: one period plus the time the threshold takes to arrive)."""

    def __init__(
        self, port: int, threshold: int = FIRST_BYTES_THRESHOLD, period: float = 0.002
    ) -> None:
        super().__init__(daemon=True)
        self.port, self.threshold, self.period = port, threshold, period
        self.base = tcp_bytes_received(port)
        self.t_ns = 0
        self._halt = threading.Event()

    def received(self) -> int:
        """Bytes received on the port since :attr:`base` (sockets closed since then drop out)."""
        now = tcp_bytes_received(self.port)
        return sum(max(0, n - self.base.get(k, 0)) for k, n in now.items())

    def run(self) -> None:
        while not self._halt.is_set():
            if self.received() >= self.threshold:
                self.t_ns = time.monotonic_ns()
                return
            time.sleep(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(2)

    def server_window_s(self, end_ns: int) -> float | None:
        """:func:`server_window_s` from this watcher's mark."""
        return server_window_s(self.t_ns, end_ns)


class MemoryGuard(threading.Thread):
    """Watch a point: every ``period`` s sum the ``VmRSS`` of the server-side process trees
    (``server_pids()``, re-read each time: replicas may come and go) and of the clients, read
    ``MemAvailable``, and when :func:`guard_decision` says so call ``kill`` once and keep the
    sizes seen in :attr:`tripped`. :attr:`peak_server_rss` is the highest server sum seen
    (sampled: the exact peak is :func:`summed_hwm`); :attr:`last` the latest sample.

    Every process it sees gets ``oom_score_adj`` 1000: should memory run out between two
    samples, the kernel's OOM killer takes one of the point's processes, not the benchmark
    or the rest of the machine; :meth:`sigkilled` then records that as the point's result.
    """

    def __init__(
        self,
        server_pids: Callable[[], Iterable[int]],
        kill: Callable[[], None],
        *,
        client_pids: Callable[[], Iterable[int]] = lambda: (),
        limit_bytes: int = 0,
        floor_bytes: int = DEFAULT_FLOOR_BYTES,
        period: float = 0.05,
    ) -> None:
        super().__init__(daemon=True)
        self.server_pids, self.client_pids, self.kill = server_pids, client_pids, kill
        self.limit_bytes, self.floor_bytes, self.period = limit_bytes, floor_bytes, period
        self.peak_server_rss = 0
        self.last: dict[str, int] = {}
        self.tripped: dict[str, Any] | None = None
        self._adjusted: set[int] = set()
        self._halt = threading.Event()

    def _oom_first(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid in self._adjusted or pid == os.getpid():
                continue
            self._adjusted.add(pid)
            with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write("1000")

    def run(self) -> None:
        while not self._halt.is_set():
            servers, clients = tree(self.server_pids()), tree(self.client_pids())
            self._oom_first(servers + clients)
            server = sum(status_bytes(pid, "VmRSS") for pid in servers)
            client = sum(status_bytes(pid, "VmRSS") for pid in clients)
            avail = mem_available()
            self.peak_server_rss = max(self.peak_server_rss, server)
            self.last = {
                "server_rss_bytes": server,
                "client_rss_bytes": client,
                "available_bytes": avail,
            }
            why = guard_decision(
                server, avail, limit_bytes=self.limit_bytes, floor_bytes=self.floor_bytes
            )
            if why is not None:
                over = bool(self.limit_bytes) and server > self.limit_bytes
                self.tripped = {"reason": why, "cause": "limit" if over else "floor", **self.last}
                self.kill()
                return
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def failure(self, **sizes: Any) -> dict[str, Any]:
        """The :func:`failure` record of a tripped guard."""
        assert self.tripped is not None
        return failure("killed", self.tripped["reason"], **self.tripped, **sizes)

    def sigkilled(self, who: str, **sizes: Any) -> dict[str, Any]:
        """The record of a point whose process ``who`` died of SIGKILL that the guard did not
        send (the kernel's OOM killer, most likely), with the last sizes sampled."""
        return failure(
            "killed",
            f"{who} was killed by SIGKILL that the guard did not send (the kernel's OOM killer, "
            f"most likely); last sample before it",
            cause="sigkill",
            **self.last,
            **sizes,
        )


# ----------------------------------------------------------------------------- failures
def tail(path: Path, n: int = 1500) -> str:
    """The last ``n`` characters of a log file ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def point_failure(
    guard: MemoryGuard | None,
    server: tuple[str, subprocess.Popen[bytes], Path],
    clients: Sequence[tuple[subprocess.Popen[bytes], Path]],
    deadline: float,
    timeout_detail: str,
    /,
    *,
    server_may_finish: bool,
    **sizes: Any,
) -> dict[str, Any] | None:
    """The :func:`failure` record of a point that cannot finish, else None; one check for both
    sides of a comparison, in this order: the guard tripped; a process died of SIGKILL the guard
    did not send; a client exited non-zero; the server (``(name, process, log)``) exited
    (non-zero only, with ``server_may_finish``: a server that ends once its rounds are done);
    ``deadline`` (``time.monotonic``) passed (``timeout_detail`` says what never came). The
    arguments before ``/`` are positional, so ``sizes`` may hold any name (``clients``)."""
    name, proc, log = server
    if guard is not None and guard.tripped is not None:
        return guard.failure(**sizes)
    for who, p in [(name, proc), *((f"client {k}", c) for k, (c, _) in enumerate(clients))]:
        if p.poll() == -signal.SIGKILL and guard is not None:
            return guard.sigkilled(who, **sizes)
    for k, (p, client_log) in enumerate(clients):
        if p.poll() not in (None, 0):
            return failure(
                "error", f"client {k} exited {p.returncode}: {tail(client_log)}", **sizes
            )
    if proc.poll() not in ((None, 0) if server_may_finish else (None,)):
        return failure("error", f"{name} exited {proc.returncode}: {tail(log)}", **sizes)
    if time.monotonic() > deadline:
        return failure("timeout", timeout_detail, **sizes)
    return None
