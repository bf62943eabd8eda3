"""Fault (k) of the campaign (:mod:`bench.faults`): the object stores' memory file system
nearly full, at the job's creation and mid round, and the evidence that uploads were refused
while it was.

Each fill makes the platform's capped tmpfs :data:`SHM_LEFT` bytes larger than what it holds
(less than one update) by remounting it smaller, at once, and back afterwards. Two things
decide whether it refuses anything:

- The store must be full before the phase's uploads come. af77c5b's campaign filled it with
  a ballast file, one ``fallocate`` of all the free space: tmpfs gives back every page of a
  ``fallocate`` that fails with ``ENOSPC``, so while the platform allocated it failed at its
  end, was undone whole, and the next, half as large, too; the store took seconds to fill
  (4 to 7 s even in 64 MiB steps, with the platform busy on 2 cores), and the phase's
  uploads had their objects by then (round 1 of one run, the uploads still to come mid round
  in another). A remount takes no time.
- An upload must need new pages then. A gateway keeps at most one spare buffer per job
  (``FEDFAAS_GATEWAY_POOL_MAX_BYTES=1``) and an upload that lands in it takes no new memory:
  mid round the fill goes in with most of the round's uploads still to come.

The round's own objects (accumulators) are never refused: their slots wait while the store is
full (``fedfaas_gateway_accumulators_refused``). So a fill that refuses no upload only holds
the round up: it ends as soon as the round has all its uploads, else :data:`SHM_FULL_S` after
the first refused upload, and at most :data:`SHM_HOLD_MAX_S`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.fault_platform import (
    Campaign,
    JobRun,
    counters_grown,
    free_bytes,
    snapshot_counters,
)

#: bytes left free in the platform's shm file system (less than one update)
SHM_LEFT = 8 * 2**20
#: seconds the store stays full after the first upload refused in it, at most
#: :data:`SHM_HOLD_MAX_S` in all
SHM_FULL_S = 5.0
SHM_HOLD_MAX_S = 60.0
_MS_REMOUNT = 32
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
#: how often the fill takes back the pages the platform frees
FILL_POLL_S = 0.01
#: a refusal the SDK logs this long after the fill ended was still answered while full
REFUSAL_SLACK_S = 1.0
#: the gateways' counters of what the full store refused
STORE_FULL = "fedfaas_gateway_updates_rejected{code=store_full}"
ACCUMULATORS = "fedfaas_gateway_accumulators_refused"
#: the fill's phases: the round whose uploads it refuses (mid round: the fault's round, the
#: last) and the words of the evidence
PHASES = {"creation": "at the job's creation", "mid_round": "mid round"}


def fill_store(c: Campaign, run: JobRun, phase: str, rnd: int, clients: int) -> dict[str, Any]:
    """Keep the platform's capped shm file system at :data:`SHM_LEFT` bytes free while
    :func:`hold_full` says so (shrunk again whenever the platform frees pages), then give it
    its size back. Mid round, the held client uploads once the store is full. What the phase
    saw goes into ``run.checks["full_phases"][phase]``: how long the store took to fill, the
    uploads of round ``rnd`` (``clients`` in all) acknowledged before and while it was full,
    what the gateways refused meanwhile (their counters before and after) and the uploads
    refused 503 ``store_full`` that the SDK sent again (``uploads_refused``)."""
    from fedfaas.platform import state

    st = state.load(c.p.state_dir)
    assert st is not None
    shm = Path(st.shm_dir)
    before = snapshot_counters(c)
    t0 = time.monotonic()
    size = total_bytes(shm)
    free = least = free_bytes(shm)
    full_at, acked_full = t0, 0
    try:
        shrink(shm)
        full_at, acked_full = time.monotonic(), len(run.acked.get(rnd, {}))
        least = min(least, free_bytes(shm))
        if phase == "mid_round":
            run.injected_done.set()  # the held client uploads into the full store now
        while hold_full(
            time.monotonic(),
            t0,
            first_refusal(store_full_times(run.refusals), t0),
            clients - len(run.acked.get(rnd, {})),
        ):
            time.sleep(FILL_POLL_S)
            if free_bytes(shm) > SHM_LEFT + 2**20:  # the platform freed pages: take them
                shrink(shm)
            least = min(least, free_bytes(shm))
    finally:
        shrunk = size - total_bytes(shm)
        resize(shm, size)
        t1 = time.monotonic()
        run.full_windows.append((t0, t1))
    grown = counters_grown(before, snapshot_counters(c))
    acked = len(run.acked.get(rnd, {}))
    record: dict[str, Any] = {
        "round": rnd,
        "free_before_mib": round(free / 2**20, 1),
        "shrunk_by_mib": round(shrunk / 2**20, 1),
        "least_free_kib": least // 1024,
        "filled_in_s": round(full_at - t0, 3),
        "held_s": round(t1 - t0, 3),
        "acked_before_full": acked_full,
        "acked_while_full": acked - acked_full,
        "store_full": sum(d.get(STORE_FULL, 0.0) for d in grown.values()),
        "accumulators_refused": sum(d.get(ACCUMULATORS, 0.0) for d in grown.values()),
    }
    run.checks.setdefault("full_phases", {})[phase] = record

    def count() -> None:  # the SDK logs a refusal answered while full just after the fill
        times = store_full_times(run.refusals)
        record["uploads_refused"] = sum(1 for t in times if t0 <= t <= t1 + REFUSAL_SLACK_S)

    threading.Timer(REFUSAL_SLACK_S, count).start()
    return {
        f"{phase}_shrunk_by_mib": round(shrunk / 2**20, 1),
        f"{phase}_least_free_kib": least // 1024,
        "ended_at": t1,
    }


def store_full_times(refusals: list[tuple[float, str]]) -> list[float]:
    """When the SDK logged an upload refused 503 ``store_full`` that it sends again, of the
    job's "refused for now" waits (``JobRun.refusals``, :class:`bench.faults._Refusals`)."""
    return [t for t, msg in refusals if "503 store_full" in msg]


def total_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def resize(mount: Path, nbytes: int) -> None:
    """Remount the tmpfs at ``mount`` with ``nbytes`` of room (``EINVAL`` below its use)."""
    opts = f"size={nbytes}".encode()
    if _libc.mount(b"tmpfs", str(mount).encode(), b"tmpfs", _MS_REMOUNT, opts) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"remount {mount} size={nbytes}: {os.strerror(e)}")


def shrink(mount: Path) -> None:
    """Make the tmpfs at ``mount`` :data:`SHM_LEFT` bytes larger than what it holds, at
    once (the platform allocating meanwhile makes the remount fail: asked again)."""
    for _ in range(100):
        st = os.statvfs(mount)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        try:
            resize(mount, used + SHM_LEFT)
            return
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    raise RuntimeError(f"{mount}: could not shrink it to {SHM_LEFT} bytes free in 100 tries")


def first_refusal(times: list[float], t0: float) -> float | None:
    """The first of ``times`` (an upload refused) since ``t0`` (None: none yet)."""
    return min((t for t in times if t >= t0), default=None)


def hold_full(now: float, t0: float, refused_at: float | None, uploads_left: int) -> bool:
    """Whether a fill that began at ``t0`` keeps the store full at ``now``: for
    :data:`SHM_FULL_S` after the first refused upload (``refused_at``), else while the round
    still has uploads to come (``uploads_left``: none left, nothing can be refused and the
    fill only holds the round's accumulators up), and never past :data:`SHM_HOLD_MAX_S`."""
    if now - t0 >= SHM_HOLD_MAX_S:
        return False
    if refused_at is not None:
        return now - refused_at < SHM_FULL_S
    return uploads_left > 0


def shm_evidence(run: JobRun) -> tuple[bool, str]:
    """Hit when in each phase an upload was refused 503 ``store_full`` while the store was
    full and the SDK sent it again (the refusals it logged from the fill's start until
    :data:`REFUSAL_SLACK_S` after its end: exactly that phase's, uploads only). The gateways'
    ``store_full`` counter over the fill also counts cross-node partials refused."""
    phases = run.checks.get("full_phases") or {}
    hit, said = True, []
    for name, words in PHASES.items():
        p = phases.get(name)
        if p is None:
            hit = False
            said.append(f"no fill {words}")
            continue
        ups = p.get("uploads_refused", 0)
        hit = hit and ups >= 1
        said.append(
            f"{words} {ups} upload(s) refused store_full and sent again (the gateways refused "
            f"{p['store_full']:g}, partials included; full in {p['filled_in_s']:.1f} s, "
            f"{p['acked_while_full']} of round {p['round']}'s uploads acknowledged while "
            f"full, {p['acked_before_full']} before; accumulators waited "
            f"{p['accumulators_refused']:g} times)"
        )
    return hit, "while the store was full: " + "; ".join(said)
