"""Locality-aware placement of expected model updates onto nodes (LIFL section 5.1).

Pure: arrays in, a :class:`Placement` out; no I/O, no clock.

The problem is bin packing. Each expected update (an *item*) has a size (its load in capacity
units: 1.0 for one update of the reference model) and each node a *residual capacity*
``RC_i = MC_i - k_i * E_i`` (:func:`residual_capacity`). Items are taken one by one in the
chosen order and put on a node:

``bestfit`` (default)
    the feasible node (``RC_i >= size``) with the *least* residual capacity: load is packed
    onto the fewest nodes, so most partials travel over shared memory.
``worstfit``
    the feasible node with the *most* residual capacity (spreads load).
``firstfit``
    the first feasible node in node order.
``leastconn``
    the paper's baseline (Knative "least connection"): the node with the smallest queue
    (``queue_i`` plus what this call has put there), capacity ignored.

Ties always go to the lowest node index, so the result is deterministic; callers that want
a name order pass nodes sorted by name.

Overflow (no node can take an item): with ``overflow="spill"`` (default) the item goes to
the node with the most residual capacity left (ties: lowest index), which may go negative;
its index is listed in :attr:`Placement.overflowed` so the caller can scale out or warn.
With ``overflow="reject"`` the item is not placed (``assignment == -1``) and is listed in
:attr:`Placement.unplaced`. ``leastconn`` never rejects; items it puts on a node without room
are listed in ``overflowed`` too.

Speed: consecutive items of equal size (one job = one model size, so a round's clients are
one run; ``order="decreasing"`` makes every size one run) are placed in one vectorised step
that gives exactly the item-by-item result: O(N log N + run length) per run for N nodes.
Short runs (mixed sizes in arrival order) fall back to an O(N) Python scan per item.
Fitting uses an absolute tolerance of :data:`TOL` capacity units.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from control_plane.errors import InvalidInput

Policy = Literal["bestfit", "worstfit", "firstfit", "leastconn"]
POLICIES: tuple[str, ...] = ("bestfit", "worstfit", "firstfit", "leastconn")
TOL = 1e-9
#: Runs shorter than this are placed item by item in Python (cheaper than numpy set-up).
_SHORT_RUN = 24
#: With at least this many nodes, mostly-mixed sizes use the sorted (bisect) item loop.
_SORTED_NODES = 16

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Placement:
    """Result of :func:`place`.

    Attributes
    ----------
    policy
        The policy used.
    assignment
        Node index per item (same order as the input sizes); -1 where not placed.
    residual
        Residual capacity of each node after placement (may be negative after spills).
    overflowed
        Indices of items placed on a node that had no room for them (spill, leastconn).
    unplaced
        Indices of items not placed (``overflow="reject"`` only).
    """

    policy: str
    assignment: IntArray
    residual: FloatArray
    overflowed: IntArray
    unplaced: IntArray

    def counts(self) -> IntArray:
        """Number of items per node."""
        placed = self.assignment[self.assignment >= 0]
        return np.bincount(placed, minlength=len(self.residual)).astype(np.int64)

    def nodes_used(self) -> int:
        """Number of nodes that received at least one item."""
        return int(np.count_nonzero(self.counts()))


def residual_capacity(
    mc: npt.ArrayLike, arrival_rate: npt.ArrayLike, exec_time: npt.ArrayLike
) -> FloatArray:
    """``RC_i = MC_i - k_i * E_i`` (LIFL section 5.1), element-wise.

    Parameters
    ----------
    mc
        Maximum service capacity of each node (updates aggregated concurrently).
    arrival_rate
        ``k_i``: updates per second arriving at each node.
    exec_time
        ``E_i``: mean seconds to aggregate one update on each node.
    """
    m = _vector(mc, "mc")
    k = _vector(arrival_rate, "arrival_rate")
    e = _vector(exec_time, "exec_time")
    if not (m.shape == k.shape == e.shape):
        raise InvalidInput("mc, arrival_rate and exec_time must have one entry per node")
    if (k < 0).any() or (e < 0).any():
        raise InvalidInput("arrival_rate and exec_time must be >= 0")
    return m - k * e


def place(
    sizes: npt.ArrayLike,
    residual: npt.ArrayLike,
    policy: str = "bestfit",
    *,
    queue: npt.ArrayLike | None = None,
    order: Literal["arrival", "decreasing"] = "arrival",
    overflow: Literal["spill", "reject"] = "spill",
) -> Placement:
    """Place items of the given sizes onto nodes with the given residual capacity.

    Parameters
    ----------
    sizes
        Size of each item (> 0, finite), in capacity units.
    residual
        Residual capacity ``RC_i`` of each node (finite; may be <= 0 for a full node).
    policy
        ``bestfit`` (default), ``worstfit``, ``firstfit`` or ``leastconn``.
    queue
        Current queue length of each node, used by ``leastconn`` (default: zeros).
    order
        ``arrival``: items in the given order (online). ``decreasing``: largest first,
        stable (the offline "... Decreasing" variants).
    overflow
        What to do with items no node has room for; see the module docstring.

    Returns
    -------
    Placement
        Assignment per item in the *input* order, residuals after, overflow lists.

    Raises
    ------
    InvalidInput
        Unknown policy/order/overflow, empty node list, non-finite or non-positive sizes.
    """
    if policy not in POLICIES:
        raise InvalidInput(f"unknown placement policy {policy!r}; use one of {', '.join(POLICIES)}")
    if order not in ("arrival", "decreasing"):
        raise InvalidInput(f"unknown order {order!r}; use 'arrival' or 'decreasing'")
    if overflow not in ("spill", "reject"):
        raise InvalidInput(f"unknown overflow {overflow!r}; use 'spill' or 'reject'")
    s_all = _vector(sizes, "sizes")
    r_arr = _vector(residual, "residual")
    if r_arr.size == 0:
        raise InvalidInput("no nodes to place on: residual is empty")
    if s_all.size and (s_all <= 0).any():
        raise InvalidInput("sizes must be > 0")
    q_arr = np.zeros_like(r_arr) if queue is None else _vector(queue, "queue")
    if q_arr.shape != r_arr.shape:
        raise InvalidInput("queue must have one entry per node, like residual")

    m = s_all.size
    idx = np.argsort(-s_all, kind="stable") if order == "decreasing" else np.arange(m)
    s_sorted = s_all[idx]
    out = np.full(m, -1, dtype=np.int64)
    over = np.zeros(m, dtype=bool)
    r = r_arr.tolist()
    q = q_arr.tolist()
    starts = [0, *(np.flatnonzero(np.diff(s_sorted) != 0) + 1).tolist(), m] if m else [0]
    short = sum(b - a for a, b in zip(starts[:-1], starts[1:], strict=False) if b - a < _SHORT_RUN)
    if policy != "firstfit" and r_arr.size >= _SORTED_NODES and 2 * short > m:
        # mostly mixed sizes: one sorted pass, O(log N) search per item
        out[:], over[:] = _place_sorted(policy, s_sorted.tolist(), r, q, overflow)
        starts = [0]
    for a, b in zip(starts[:-1], starts[1:], strict=False):
        s = float(s_sorted[a])
        if b - a < _SHORT_RUN:
            for t in range(a, b):
                out[t], over[t] = _place_one(policy, s, r, q, overflow)
        else:
            nodes, flags = _place_run(policy, s, b - a, r, q, overflow)
            out[a:b] = nodes
            over[a:b] = flags
    assignment = np.empty(m, dtype=np.int64)
    assignment[idx] = out
    overflowed = np.zeros(m, dtype=bool)
    overflowed[idx] = over
    return Placement(
        policy=policy,
        assignment=assignment,
        residual=np.asarray(r, dtype=np.float64),
        overflowed=np.flatnonzero(overflowed).astype(np.int64),
        unplaced=np.flatnonzero(assignment < 0).astype(np.int64),
    )


def _vector(x: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidInput(f"{name} must be a 1-D sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidInput(f"{name} must be finite (no NaN or Inf)")
    return arr


def _place_one(
    policy: str, s: float, r: list[float], q: list[float], overflow: str
) -> tuple[int, bool]:
    """Item-by-item reference semantics (also the fast path for short runs)."""
    n = len(r)
    if policy == "leastconn":
        best = min(range(n), key=q.__getitem__)  # min() keeps the first of equal keys
        fits = r[best] >= s - TOL
        r[best] -= s
        q[best] += s
        return best, not fits
    best = -1
    need = s - TOL
    if policy == "firstfit":
        for i in range(n):
            if r[i] >= need:
                best = i
                break
    elif policy == "bestfit":
        for i in range(n):
            ri = r[i]
            if ri >= need and (best < 0 or ri < r[best]):
                best = i
    else:  # worstfit
        for i in range(n):
            ri = r[i]
            if ri >= need and (best < 0 or ri > r[best]):
                best = i
    if best >= 0:
        r[best] -= s
        q[best] += s
        return best, False
    if overflow == "reject":
        return -1, False
    best = max(range(n), key=r.__getitem__)
    r[best] -= s
    q[best] += s
    return best, True


def _place_sorted(
    policy: str, sizes: list[float], r: list[float], q: list[float], overflow: str
) -> tuple[list[int], list[bool]]:
    """Item-by-item placement with the nodes kept in a sorted list (same result as _place_one).

    Keys: bestfit ``(RC, i)`` (first key with RC >= s), worstfit ``(RC, -i)`` (last key),
    leastconn ``(queue, i)`` (first key). Spills take the largest RC, lowest index.
    """
    n = len(r)
    if policy == "leastconn":
        keys = sorted((q[i], i) for i in range(n))
    elif policy == "worstfit":
        keys = sorted((r[i], -i) for i in range(n))
    else:
        keys = sorted((r[i], i) for i in range(n))
    out: list[int] = []
    over: list[bool] = []
    for s in sizes:
        if policy == "leastconn":
            _, i = keys.pop(0)
            over.append(r[i] < s - TOL)
            r[i] -= s
            q[i] += s
            insort(keys, (q[i], i))
            out.append(i)
            continue
        if policy == "bestfit":
            j = bisect_left(keys, (s - TOL, -1))
            fits = j < n
        else:
            j = n - 1
            fits = keys[j][0] >= s - TOL
        if not fits:
            if overflow == "reject":
                out.append(-1)
                over.append(False)
                continue
            j = n - 1 if policy == "worstfit" else bisect_left(keys, (keys[-1][0], -1))
        i = abs(keys.pop(j)[1])
        r[i] -= s
        q[i] += s
        insort(keys, (r[i], -i) if policy == "worstfit" else (r[i], i))
        out.append(i)
        over.append(not fits)
    return out, over


def _place_run(
    policy: str, s: float, length: int, r: list[float], q: list[float], overflow: str
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Place ``length`` items of size ``s``; same result as ``length`` calls of _place_one."""
    rr = np.asarray(r, dtype=np.float64)
    n = rr.size
    nodes_idx = np.arange(n, dtype=np.int64)
    flags = np.zeros(length, dtype=bool)
    if policy == "leastconn":
        qq = np.asarray(q, dtype=np.float64)
        chosen, slot = _smallest_slots(qq, s, np.full(n, length, dtype=np.int64), length)
        # the residual before each item is r_i - slot*s: it fitted iff that was >= s
        flags = (rr[chosen] - slot * s) < s - TOL
        _apply(chosen, s, r, q)
        return chosen, flags
    cap = np.where(rr >= s - TOL, np.floor((rr + TOL) / s), 0).astype(np.int64)
    if policy == "worstfit":
        chosen, _ = _smallest_slots(-rr, s, cap, length)
    else:
        feasible = nodes_idx[cap > 0]
        if policy == "bestfit":
            feasible = feasible[np.lexsort((feasible, rr[feasible]))]
        take = np.minimum(
            cap[feasible], np.maximum(0, length - (np.cumsum(cap[feasible]) - cap[feasible]))
        )
        chosen = np.repeat(feasible, take)
    _apply(chosen, s, r, q)
    rest = length - chosen.size
    if rest == 0:
        return chosen, flags
    if overflow == "reject":
        tail = np.full(rest, -1, dtype=np.int64)
    else:
        rr2 = np.asarray(r, dtype=np.float64)
        tail, _ = _smallest_slots(-rr2, s, np.full(n, rest, dtype=np.int64), rest)
        _apply(tail, s, r, q)
        flags[chosen.size :] = True
    return np.concatenate([chosen, tail]), flags


def _apply(chosen: IntArray, s: float, r: list[float], q: list[float]) -> None:
    if chosen.size == 0:
        return
    counts = np.bincount(chosen, minlength=len(r))
    for i in np.flatnonzero(counts).tolist():
        c = int(counts[i])
        r[i] -= c * s
        q[i] += c * s


def _smallest_slots(
    base: FloatArray, s: float, cap: IntArray, want: int
) -> tuple[IntArray, IntArray]:
    """The ``want`` smallest keys ``base_i + j*s`` (``j < cap_i``), ties by node index.

    This is the order in which "take the node with the smallest current key, then add s to
    its key" visits nodes (worstfit with key -RC, leastconn with key = queue). Returns the
    node of each taken slot, in order, and its ``j``. A bisection on the key threshold keeps
    the candidate set to at most ``want + N`` slots whatever the capacities are.
    """
    total = int(cap.sum())
    if total <= want:
        counts = cap
    else:
        lo = float(base.min()) - s  # count(lo) == 0 < want
        hi = float((base + (cap - 1) * s)[cap > 0].max())  # count(hi) == total >= want

        def count(t: float) -> IntArray:
            c = np.floor((t - base) / s + TOL).astype(np.int64) + 1
            return np.clip(c, 0, cap)

        # at hi - lo < s/2 at most one slot per node lies in (lo, hi], so count(hi) < want + N
        for _ in range(200):
            if hi - lo < s / 2:
                break
            mid = (lo + hi) / 2
            if int(count(mid).sum()) >= want:
                hi = mid
            else:
                lo = mid
        counts = count(hi)
    node = np.repeat(np.arange(base.size, dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    slot = np.arange(node.size, dtype=np.int64) - np.repeat(starts, counts)
    keys = base[node] + slot * s
    order = np.lexsort((node, keys))[:want]
    return node[order], slot[order]
