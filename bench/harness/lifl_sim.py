"""A model of one aggregation round through a planned hierarchy (LIFL Fig. 8). Pure.

This is a *model*, not a measurement of the running system: it replays the control plane's
real placement (:func:`~control_plane.placement.place`) and plan
(:func:`~control_plane.planning.plan_hierarchy`), and the reuse rules of
:mod:`~control_plane.reuse` (first finished leaf -> middle, first finished middle -> top),
against per-operation costs that the caller measures on the machine (:class:`CostModel`). Optionally it carries real vectors
through the same tree, so tests check that every path gives exactly the flat FedAvg result.

Model (what is and is not in it):

* updates are already sealed in the node's shared-memory queue at their arrival times
  (``arrival``; the paper's Fig. 8 assumes the estimated queue equals the real one);
* an aggregator is a sequential worker: *eager* folds each input when it arrives
  (``t = max(t, a) + agg``), *lazy* waits for its whole goal then folds them in a batch;
* a replica is either pre-warmed by the planner (``planning``: the leaves of the plan are
  started before the round; their start-up still counts as CPU and as "created"), reused
  (``reuse``: a node's first finished leaf becomes its middle, the first finished middle
  becomes the top: no start-up at all), or started on demand when its first input arrives
  (cold start ``cold_s`` on the critical path);
* every variant uses the same tree shape (I updates per leaf, a middle per node, one top);
  what planning adds is that the planned leaves are warm before the updates arrive;
* a partial moving to another node costs ``xfer_s`` and the receiving gateway takes such
  transfers one at a time (FIFO); on the same node it costs ``key_s`` (a key handoff);
* no CPU contention between aggregators on a node (placement keeps each node within MC,
  which is defined as the concurrency a node sustains without slowing down).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from control_plane.placement import place
from control_plane.planning import plan_hierarchy


@dataclass(frozen=True)
class CostModel:
    """Per-operation costs in seconds (measure them; see ``bench/control.py``)."""

    agg_s: float
    cold_s: float
    cold_cpu_s: float
    xfer_s: float
    xfer_cpu_s: float
    key_s: float


@dataclass(frozen=True)
class Variant:
    """One step of the Fig. 8 ladder."""

    name: str
    policy: str
    planning: bool
    reuse: bool
    eager: bool


#: The Fig. 8 ladder: baseline SL-H, then +placement, +planning, +reuse, +eager.
FIG8_VARIANTS: tuple[Variant, ...] = (
    Variant("SL-H (leastconn, lazy)", "leastconn", False, False, False),
    Variant("+placement (BestFit)", "bestfit", False, False, False),
    Variant("+planning (EWMA, I=2)", "bestfit", True, False, False),
    Variant("+reuse", "bestfit", True, True, False),
    Variant("+eager (LIFL)", "bestfit", True, True, True),
)


@dataclass
class RoundResult:
    """Outcome of :func:`simulate_round`."""

    act_s: float
    cpu_s: float
    created: int
    nodes_used: int
    cross_node: int
    model: npt.NDArray[np.float64] | None = None
    weighted_sum: npt.NDArray[np.float64] | None = None
    weight: float = 0.0


@dataclass
class _Out:
    finish: float
    node: str
    replica_ready: float
    acc: npt.NDArray[np.float64] | None
    weight: float


def simulate_round(
    capacity: list[float],
    variant: Variant,
    costs: CostModel,
    arrival: npt.ArrayLike,
    *,
    per_leaf: int = 2,
    updates: npt.NDArray[np.float64] | None = None,
    weights: npt.ArrayLike | None = None,
) -> RoundResult:
    """Run one round of ``len(arrival)`` updates through ``variant`` and return its costs.

    Parameters
    ----------
    capacity
        Residual capacity of each node (``MC`` at the start of a round).
    variant
        Which control-plane features are on.
    costs
        Measured per-operation costs.
    arrival
        Time each update is sealed in its node's queue (seconds from round start), in
        update order; also the order updates reach their leaves.
    per_leaf
        ``I``: updates per leaf.
    updates, weights
        Optional ``(n, d)`` update vectors and their sample counts: the result then carries
        the aggregated model (partial sums, one division at the top).
    """
    arr = np.asarray(arrival, dtype=np.float64)
    n = arr.size
    names = [f"node{i}" for i in range(len(capacity))]
    pl = place(np.ones(n), capacity, variant.policy, queue=np.zeros(len(capacity)))
    counts = pl.counts()
    expected = {names[i]: int(c) for i, c in enumerate(counts)}
    plan = plan_hierarchy(expected, per_leaf)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    stats = {"agg": 0, "created": 0, "cross": 0, "key": 0}

    def run(
        ready: float,
        inputs: list[tuple[float, npt.NDArray[np.float64] | None, float]],
        own: tuple[npt.NDArray[np.float64] | None, float] | None,
    ) -> tuple[float, npt.NDArray[np.float64] | None, float]:
        """Fold ``inputs`` (arrival, vector, weight) starting at ``ready``; ``own`` is a partial
        already held by the replica (reuse)."""
        inputs = sorted(inputs, key=lambda x: x[0])
        stats["agg"] += len(inputs)
        if variant.eager:
            t = ready
            for a, _, _ in inputs:
                t = max(t, a) + costs.agg_s
        else:
            last = max((a for a, _, _ in inputs), default=ready)
            t = max(ready, last) + len(inputs) * costs.agg_s
        acc = None if own is None else own[0]
        wsum = 0.0 if own is None else own[1]
        if updates is not None:
            vecs = [v for _, v, _ in inputs if v is not None]
            if variant.eager:  # one at a time, in arrival order
                for v in vecs:
                    acc = v.copy() if acc is None else acc + v
            elif vecs:  # lazy: one batch sum
                batch = np.sum(np.stack(vecs), axis=0)
                acc = batch if acc is None else acc + batch
        wsum += sum(x[2] for x in inputs)
        return t, acc, wsum

    # leaves: the j-th update arriving at a node goes to plan.leaf_for_arrival(node, j)
    leaf_inputs: dict[str, list[tuple[float, npt.NDArray[np.float64] | None, float]]] = {}
    seen: dict[str, int] = {}
    for u in np.argsort(arr, kind="stable").tolist():
        node = names[int(pl.assignment[u])]
        j = seen.get(node, 0)
        seen[node] = j + 1
        lid = plan.leaf_for_arrival(node, j)
        vec = None if updates is None else w[u] * updates[u]
        leaf_inputs.setdefault(lid, []).append((float(arr[u]), vec, float(w[u])))

    middles: list[_Out] = []
    for np_ in plan.nodes:
        leaves: list[tuple[str, _Out]] = []
        for k in np_.leaf_numbers:
            lid = f"{np_.node}:leaf:{k}"
            ins = leaf_inputs.get(lid, [])
            stats["created"] += 1
            ready = 0.0 if variant.planning else min(a for a, _, _ in ins) + costs.cold_s
            t, acc, ws = run(ready, ins, None)
            leaves.append((lid, _Out(t, np_.node, ready, acc, ws)))
        first = min(leaves, key=lambda x: (x[1].finish, x[0]))
        if variant.reuse:  # the first finished leaf becomes the middle, keeping its partial
            others = [o for lid, o in leaves if lid != first[0]]
            ready = first[1].finish
            own: tuple[npt.NDArray[np.float64] | None, float] | None = (
                first[1].acc,
                first[1].weight,
            )
        else:
            others = [o for _, o in leaves]
            stats["created"] += 1
            ready = first[1].finish + costs.key_s + costs.cold_s
            own = None
        stats["key"] += len(others)
        ins = [(o.finish + costs.key_s, o.acc, o.weight) for o in others]
        t, acc, ws = run(ready, ins, own)
        middles.append(_Out(t, np_.node, ready, acc, ws))

    if variant.reuse:
        top_src = min(middles, key=lambda o: (o.finish, o.node))
        top_node, ready = top_src.node, top_src.finish
        own_top: tuple[npt.NDArray[np.float64] | None, float] | None = (top_src.acc, top_src.weight)
        others = [o for o in middles if o is not top_src]
    else:
        top_node = plan.top_node or names[0]
        others = list(middles)
        stats["created"] += 1
        first_send = min(o.finish for o in middles)
        ready = first_send + costs.cold_s
        own_top = None
    ins = []
    gateway_free = 0.0  # the top node's gateway receives cross-node partials one at a time
    for o in sorted(others, key=lambda o: (o.finish, o.node)):
        if o.node == top_node:
            stats["key"] += 1
            ins.append((o.finish + costs.key_s, o.acc, o.weight))
        else:
            stats["cross"] += 1
            gateway_free = max(gateway_free, o.finish) + costs.xfer_s
            ins.append((gateway_free, o.acc, o.weight))
    t, acc, ws = run(ready, ins, own_top)
    t += costs.agg_s  # the top's single division pass
    model = None if acc is None or updates is None else acc / ws
    cpu = (
        (stats["agg"] + 1) * costs.agg_s
        + stats["created"] * costs.cold_cpu_s
        + stats["cross"] * costs.xfer_cpu_s
        + stats["key"] * costs.key_s
    )
    return RoundResult(
        act_s=t,
        cpu_s=cpu,
        created=stats["created"],
        nodes_used=pl.nodes_used(),
        cross_node=stats["cross"],
        model=model,
        weighted_sum=acc,
        weight=ws,
    )
