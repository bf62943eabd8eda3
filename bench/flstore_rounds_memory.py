"""bench-flstore's big rounds: the node's memory while FedFaaS answers (issue 36).

Two measures, sampled every 0.2 s by :class:`MemorySampler` while FedFaaS ingests the round and
answers the queries:

- **the cache functions' private memory**: ``RssAnon`` of their processes (local processes of
  the platform's runtime, their pids from each function's ``/ping``), summed; beside it the
  engine's own budget account (``GET /v1/state``), the figure the budget is enforced on;
- **the platform's memory as the kernel charges it**: where the bench can make cgroups
  (:func:`bench.harness.cgroups.unavailable`), ``fedfaas up --with all`` is started inside a
  group of its own (:func:`platform_group`), so every process of the platform (MinIO, Redis,
  the runtime and its cache functions, the gateways, the engine, the tracker) is born there.
  The sampler reads the group's ``memory.stat``: anonymous memory plus tmpfs pages
  (``total_rss + total_shmem``: every private page and every page of ``/dev/shm`` counted
  once, whichever process maps it). The page cache is left out: MinIO's reads of the round's
  files fill it, and the kernel gives it back on demand. The group's figure before the round
  is ingested (``at_rest_bytes``) is what the platform's services hold of their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.harness.cgroups import Cgroup, CgroupError, unavailable
from bench.harness.flstore_stack import FLStoreStack

log = logging.getLogger("bench.flstore")
#: the fields of the group's ``memory.stat`` summed: private and tmpfs pages, not page cache
GROUP_FIELDS = ("total_rss", "total_shmem")


def rss_anon(pid: int) -> int:
    """Process ``pid``'s private resident memory (``RssAnon``), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def group_resident(group: Cgroup) -> int:
    """The group's anonymous and tmpfs bytes now (:data:`GROUP_FIELDS` of ``memory.stat``)."""
    fields = dict(
        line.split()[:2] for line in (group.dirs["memory"] / "memory.stat").read_text().splitlines()
    )
    return sum(int(fields.get(k, 0)) for k in GROUP_FIELDS)


@contextlib.contextmanager
def platform_group(name: str) -> Iterator[Cgroup | None]:
    """A cgroup for the platform (see the module), or None where none can be made here (the
    reason logged); removed on leaving, killing whatever the platform left in it."""
    why = unavailable()
    group: Cgroup | None = None
    if why is None:
        try:
            group = Cgroup(name)
        except CgroupError as exc:
            why = str(exc)
    if group is None:
        log.warning("the platform's memory is not measured by cgroup: %s", why)
        yield None
        return
    try:
        yield group
    finally:
        group.close()


class MemorySampler:
    """The cache functions' private memory, the engine's account and the platform's group
    (where one is given), sampled every 0.2 s from construction to :meth:`stop`; ``query``
    names what runs now (the peak says during what it came)."""

    def __init__(
        self, stack: FLStoreStack, group: Cgroup | None = None, trace: Path | None = None
    ) -> None:
        self.stack = stack
        self.group = group
        #: where each sample is written (one JSON line each), if given: when the peak came,
        #: what each function's ``RssAnon`` and the engine's account were at every sample
        self.trace = trace
        #: the engine's account (its ``memory_budget``) at the last sample, and at the peak
        self._account: dict[str, Any] = {}
        self.account_at_peak: dict[str, Any] = {}
        self.private_at_peak: dict[str, int] = {}
        self.peak_private = 0
        self.peak_accounted = 0
        self.group_at_rest = group_resident(group) if group is not None else None
        self.peak_group = self.group_at_rest or 0
        self.peak_group_query = ""
        #: each function's own peak, and the query running at each peak
        self.peaks: dict[str, int] = {}
        self.query = ""
        self.peak_query = ""
        #: the bytes of objects each function holds (the engine's table), now and at the peak
        self._held: dict[str, int] = {}
        self.held_at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._pids: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pids_now(self) -> dict[str, int]:
        st = httpx.get(f"{self.stack.engine_url}/v1/state", headers=self.stack.auth, timeout=10)
        body = st.json()
        self.peak_accounted = max(self.peak_accounted, body["memory_budget"]["used_bytes"])
        self._account = dict(body["memory_budget"])
        self._held = {n: int(f.get("used_bytes") or 0) for n, f in body["functions"].items()}
        for name in body["functions"]:
            if name not in self._pids:
                r = httpx.get(
                    f"{self.stack.runtime_url}/function/{name}/ping",
                    headers=self.stack.function_auth,
                    timeout=10,
                )
                if r.status_code == 200:
                    self._pids[name] = int(r.json()["pid"])
        return self._pids

    def _sample_group(self) -> None:
        if self.group is None:
            return
        now = group_resident(self.group)
        if now > self.peak_group:
            self.peak_group, self.peak_group_query = now, self.query

    def _run(self) -> None:
        t0 = time.monotonic()
        out = self.trace.open("w") if self.trace is not None else None
        try:
            while not self._stop.wait(0.2):
                try:
                    self._sample_group()
                    private = {n: rss_anon(pid) for n, pid in self._pids_now().items()}
                    for name, rss in private.items():
                        self.peaks[name] = max(self.peaks.get(name, 0), rss)
                    total = sum(private.values())
                    if total > self.peak_private:
                        self.peak_private, self.peak_query = total, self.query
                        self.held_at_peak = dict(self._held)
                        self.account_at_peak = dict(self._account)
                        self.private_at_peak = private
                    if out is not None:
                        sample = {"t": round(time.monotonic() - t0, 2), "query": self.query}
                        sample |= {"private": private, "total": total, "held": self._held}
                        out.write(json.dumps(sample | {"account": self._account}) + "\n")
                except (httpx.HTTPError, OSError, ValueError, KeyError):
                    continue
        finally:
            if out is not None:
                out.close()

    def stop(self) -> dict[str, Any]:
        """Stop sampling (safe twice); the peaks."""
        self._stop.set()
        self._thread.join(5)
        out: dict[str, Any] = {
            "peak_private_bytes": self.peak_private,
            "peak_accounted_bytes": self.peak_accounted,
            "peak_during": self.peak_query,
            "peaks_by_function": dict(self.peaks),
            "held_at_peak_bytes": dict(self.held_at_peak),
            # each function's RssAnon at the peak, and the engine's account then (its
            # functions_bytes: their private memory as they last reported it)
            "private_at_peak_bytes": dict(self.private_at_peak),
            "account_at_peak": dict(self.account_at_peak),
        }
        if self.group is not None:
            out["platform_group"] = {
                "measure": "+".join(GROUP_FIELDS) + " of the platform's cgroup memory.stat",
                "at_rest_bytes": self.group_at_rest,
                "peak_bytes": self.peak_group,
                "peak_during": self.peak_group_query,
            }
        return out
