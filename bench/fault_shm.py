"""Fault (k) of the campaign (:mod:`bench.faults`): the object stores' memory file system
nearly full, at the job's creation and mid round, and the evidence that uploads were refused
while it was.

Each fill keeps the platform's capped tmpfs at :data:`SHM_LEFT` bytes free (less than one
update) with a ballast file. Two things decide whether it refuses anything:

- The ballast must be in place before the phase's uploads come. tmpfs gives back every page
  of a ``fallocate`` that fails with ``ENOSPC``, so one that asks for the whole free space
  while the platform allocates meanwhile fails at its end and is undone whole, and the next,
  half as large, fails the same way: in af77c5b's campaign the store took seconds to fill,
  and the uploads of the phase had their objects by then (round 1 of one run, the uploads
  still to come mid round in another). The ballast grows in steps of at most
  :data:`BALLAST_STEP`, so a step the platform overtakes costs only itself.
- An upload must need new pages then. A gateway keeps at most one spare buffer per job
  (``FEDFAAS_GATEWAY_POOL_MAX_BYTES=1``) and an upload that lands in it takes no new memory:
  mid round the fill goes in with most of the round's uploads still to come.

The round's own objects (accumulators) are never refused: their slots wait while the store is
full (``fedfaas_gateway_accumulators_refused``). So a fill that refuses no upload only holds
the round up: it ends as soon as the round has all its uploads, else :data:`SHM_FULL_S` after
the first refusal, and at most :data:`SHM_HOLD_MAX_S`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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
#: the largest ``fallocate`` of the ballast (see the module docstring)
BALLAST_STEP = 64 * 2**20
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
    :func:`hold_full` says so (the ballast grows whenever the platform frees pages), then
    remove it. Mid round, the held client uploads once the store is full. What the phase
    saw goes into ``run.checks["full_phases"][phase]``: how long the store took to fill, the
    uploads of round ``rnd`` (``clients`` in all) acknowledged before and while it was full,
    and what the gateways refused meanwhile (their counters before and after)."""
    from fedfaas.platform import state

    st = state.load(c.p.state_dir)
    assert st is not None
    shm = Path(st.shm_dir)
    before = snapshot_counters(c)
    t0 = time.monotonic()
    free = least = free_bytes(shm)
    ballast = shm / f"ballast-{phase}"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    size, full_at, acked_full = 0, t0, 0
    try:
        size = grow_ballast(fd, size, shm)
        full_at, acked_full = time.monotonic(), len(run.acked.get(rnd, {}))
        least = min(least, free_bytes(shm))
        if phase == "mid_round":
            run.injected_done.set()  # the held client uploads into the full store now
        while hold_full(
            time.monotonic(),
            t0,
            first_refusal(run.refusals, t0),
            clients - len(run.acked.get(rnd, {})),
        ):
            time.sleep(FILL_POLL_S)
            size = grow_ballast(fd, size, shm)
            least = min(least, free_bytes(shm))
    finally:
        os.close(fd)
        ballast.unlink()
        t1 = time.monotonic()
        run.full_windows.append((t0, t1))
    grown = counters_grown(before, snapshot_counters(c))
    acked = len(run.acked.get(rnd, {}))
    run.checks.setdefault("full_phases", {})[phase] = {
        "round": rnd,
        "free_before_mib": round(free / 2**20, 1),
        "ballast_mib": round(size / 2**20, 1),
        "least_free_kib": least // 1024,
        "filled_in_s": round(full_at - t0, 3),
        "held_s": round(t1 - t0, 3),
        "acked_before_full": acked_full,
        "acked_while_full": acked - acked_full,
        "store_full": sum(d.get(STORE_FULL, 0.0) for d in grown.values()),
        "accumulators_refused": sum(d.get(ACCUMULATORS, 0.0) for d in grown.values()),
        "window_monotonic_s": [t0, t1],
    }
    return {
        f"{phase}_ballast_mib": round(size / 2**20, 1),
        f"{phase}_least_free_kib": least // 1024,
        "ended_at": t1,
    }


def grow_ballast(
    fd: int,
    size: int,
    shm: Path,
    allocate: Callable[[int, int, int], None] = os.posix_fallocate,
    free: Callable[[Path], int] = free_bytes,
) -> int:
    """Grow the ballast file ``fd`` (``size`` bytes) until ``shm`` has :data:`SHM_LEFT`
    bytes free, in steps of at most :data:`BALLAST_STEP`: the platform allocates at the same
    time, and a step it overtakes (``ENOSPC``, its pages given back whole) is tried again
    half as large. Returns the ballast's size. ``allocate`` and ``free``: the system's."""
    cap = BALLAST_STEP
    while (step := min(cap, free(shm) - SHM_LEFT)) >= 2**20:
        try:
            allocate(fd, size, step)
        except OSError:  # ENOSPC: someone took pages meanwhile
            cap = step // 2
            continue
        size, cap = size + step, BALLAST_STEP
    return size


def first_refusal(refusals: list[tuple[float, str]], t0: float) -> float | None:
    """When the SDK first logged an upload refused for now since ``t0`` (None: not yet)."""
    return min((t for t, _ in refusals if t >= t0), default=None)


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
    """Hit when in each phase the gateways refused an upload 503 ``store_full`` while the
    store was full (their counter before and after the fill: exactly that phase's) and the
    SDK sent it again (its refusals logged inside the fill)."""
    phases = run.checks.get("full_phases") or {}
    hit, said = True, []
    for name, words in PHASES.items():
        p = phases.get(name)
        if p is None:
            hit = False
            said.append(f"no fill {words}")
            continue
        t0, t1 = p["window_monotonic_s"]
        again = sum(1 for t, _ in run.refusals if t0 <= t <= t1 + REFUSAL_SLACK_S)
        hit = hit and p["store_full"] >= 1 and again >= 1
        said.append(
            f"{words} {p['store_full']:g} refused store_full ({again} sent again; full in "
            f"{p['filled_in_s']:.1f} s, {p['acked_while_full']} of round {p['round']}'s "
            f"uploads acknowledged while full, {p['acked_before_full']} before; accumulators "
            f"waited {p['accumulators_refused']:g} times)"
        )
    return hit, "uploads refused while the store was full: " + "; ".join(said)
