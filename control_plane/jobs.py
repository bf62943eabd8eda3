"""Job and round state of the coordinator: plain data, JSON views and (de)serialisation."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from control_plane.errors import InvalidInput
from control_plane.placement import POLICIES
from control_plane.planning import Plan
from control_plane.selection import FLAGGING_WORKLOADS, SELECTIONS

#: The node gateways' rules for job names and client ids (kept identical on purpose).
JOB_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
CLIENT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


#: what a round short of its minimum at the deadline does (see :attr:`JobSpec.on_shortfall`)
SHORTFALL = ("reopen", "fail")

#: clients a job may enroll
MAX_CLIENTS = 1_000_000

#: rounds a job's state keeps in ``history`` (the newest); older rounds count only in
#: :attr:`JobState.totals`, and their published records stay in MinIO (each round's
#: ``meta.json``). Bounds the job's record, which is rewritten on every change.
HISTORY_ROUNDS = 100


@dataclass
class JobSpec:
    """What a job asks for (validated by :meth:`validate`)."""

    name: str
    rounds: int
    goal: int
    #: the enrolled clients, in enrollment order (:meth:`Coordinator.enroll`); round 1 opens
    #: once ``goal`` of them are enrolled
    clients: list[str]
    overprovision: float = 1.3
    deadline_s: float = 600.0
    policy: str = "bestfit"
    per_leaf: int = 2
    size: float = 1.0
    #: a round closes at its deadline with what arrived if at least this many updates came
    min_updates: int = 1
    #: a round short of ``min_updates`` at its deadline: "reopen" (another deadline, at most
    #: ``max_reopens`` times, then the job fails) or "fail" (the job fails at once)
    on_shortfall: str = "reopen"
    max_reopens: int = 1
    #: how each round's clients are chosen: "random", or "oort" (Oort's utility from FLStore's
    #: scheduling workload, :mod:`control_plane.selection`; round 1 is random)
    selection: str = "random"
    #: the debugging loop: ``{"workload": "multi-krum" | "cosine-to-aggregate", "params":
    #: {...}}`` drops from later rounds, before aggregation, every client that FLStore's
    #: workload flags in a round (:mod:`control_plane.selection`); None: no dropping
    drop_flagged: dict[str, Any] | None = None

    def validate(self) -> None:
        """Raise :class:`InvalidInput` naming the first bad field."""
        if not JOB_NAME.match(self.name):
            raise InvalidInput(
                "job name must be 1-40 characters of a-z, 0-9 and '-', starting with a letter "
                "or digit (the node gateways' rule)"
            )
        if self.rounds < 1:
            raise InvalidInput("rounds must be >= 1")
        if self.goal < 1:
            raise InvalidInput("goal must be >= 1")
        if len(set(self.clients)) != len(self.clients) or not all(
            CLIENT_ID.match(c) for c in self.clients
        ):
            raise InvalidInput(
                "clients must be distinct ids of 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-'"
            )
        if len(self.clients) > MAX_CLIENTS:
            raise InvalidInput(f"a job has at most {MAX_CLIENTS} clients")
        if not 1.0 <= self.overprovision <= 10.0:
            raise InvalidInput(
                "overprovision must be in [1, 10] (e.g. 1.3 selects 30% more clients)"
            )
        if not 0 < self.deadline_s <= 86400:
            raise InvalidInput("deadline_s must be in (0, 86400]")
        if self.policy not in POLICIES:
            raise InvalidInput(f"policy must be one of {', '.join(POLICIES)}")
        if self.per_leaf < 1:
            raise InvalidInput("per_leaf must be >= 1")
        if not (0 < self.size < math.inf):
            raise InvalidInput("size must be a finite number > 0")
        if not 1 <= self.min_updates <= self.goal:
            raise InvalidInput(f"min_updates must be in [1, goal={self.goal}]")
        if self.on_shortfall not in SHORTFALL:
            raise InvalidInput(f"on_shortfall must be one of {', '.join(SHORTFALL)}")
        if not 0 <= self.max_reopens <= 100:
            raise InvalidInput("max_reopens must be in [0, 100]")
        if self.selection not in SELECTIONS:
            raise InvalidInput(f"selection must be one of {', '.join(SELECTIONS)}")
        d = self.drop_flagged
        if d is not None:
            if not isinstance(d, dict) or d.get("workload") not in FLAGGING_WORKLOADS:
                raise InvalidInput(
                    'drop_flagged must be {"workload": one of '
                    f'{", ".join(FLAGGING_WORKLOADS)}, "params": {{...}}}}'
                )
            if set(d) - {"workload", "params"} or not isinstance(d.get("params", {}), dict):
                raise InvalidInput("drop_flagged takes workload and params (an object) only")
            if "round" in d.get("params", {}):
                raise InvalidInput("drop_flagged: params leave out round (each ended round)")
            from flstore_workloads import WorkloadError, get

            try:  # the workload's own check, as FLStore makes it on each query
                get(d["workload"]).parse({**d.get("params", {}), "round": 1})
            except WorkloadError as exc:
                raise InvalidInput(f"drop_flagged: {exc}") from None


@dataclass
class RoundInfo:
    """State of one round."""

    number: int
    state: str  # open | aggregating | closed | expired | failed
    goal: int
    selected: list[str]
    assignment: dict[str, str]
    opened_at: float
    deadline_at: float
    closed_at: float | None = None
    received: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    plan_version: int = 0
    placement: str = "coordinator"  # or "gateway-static": the gateways kept their own plan
    published: bool = False  # a gateway reported the round's model published
    #: gateway slot ids of the round's aggregators (stable across re-plans of the round)
    slot_ids: dict[str, int] = field(default_factory=dict)
    #: why the gateways were told to close the round early ("goal", "deadline", "node_lost:<n>")
    closing: str | None = None
    #: updates the gateways were told to aggregate after closing, per node
    closed_with: dict[str, int] = field(default_factory=dict)
    #: when every gateway took the early close (the clock's; 0: not closed early)
    closing_at: float = 0.0
    #: times the round got another deadline because fewer than its minimum had arrived
    reopened: int = 0
    #: updates in the round's published model, as the gateway that published it says
    aggregated: int | None = None
    #: times another node took the job over from its dead root node during this round
    takeovers: int = 0
    #: clients whose accepted update was lost with a dead root node -> the takeover that lost
    #: it: each sends it again once (the assignment's ``resend``), and it counts once
    resend: dict[str, int] = field(default_factory=dict)
    #: how the round's clients were chosen ("random" or "oort") and, when a job asking for
    #: Oort got a random round, why
    selected_by: str = "random"
    selection_note: str = ""
    #: clients dropped from the round before aggregation (``drop_flagged``): client ->
    #: ``{"flagged_in": round, "workload": name}``; and why the round has no new flags when
    #: FLStore could not answer
    excluded: dict[str, dict[str, Any]] = field(default_factory=dict)
    drop_note: str = ""
    #: selected clients that left the round without an update, their training having failed
    #: (``POST .../rounds/{r}/failures``, :mod:`control_plane.client_rounds`) -> their error
    failures: dict[str, str] = field(default_factory=dict)
    #: a close of the round on its gateways under way (why: "goal", "deadline",
    #: "node_lost:<n>"), not taken by every gateway yet; None when none is pending
    close_pending: str | None = None
    #: updates each node held when it stopped its intake (step 1 of a close), so far
    close_counts: dict[str, int] = field(default_factory=dict)
    #: the counts every node is told to aggregate (step 2), once step 1 is done everywhere
    close_final: dict[str, int] = field(default_factory=dict)
    #: nodes that took step 2
    close_applied: list[str] = field(default_factory=list)
    #: failed attempts of the pending close (and of the round's last close, once done)
    close_attempts: int = 0
    #: why the last attempt failed, per node
    close_error: str = ""
    #: not tried again before this time (the clock's)
    close_retry_at: float = 0.0


@dataclass
class JobState:
    """A job and its current round."""

    spec: JobSpec
    completed: int = 0
    current: RoundInfo | None = None
    #: the newest :data:`HISTORY_ROUNDS` ended rounds (see :meth:`record`)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: sums over every ended round, those dropped from ``history`` included
    totals: dict[str, int] = field(default_factory=dict)
    #: client -> node of the gateways' own plan, used when they do not take ours
    gateway_client_nodes: dict[str, str] = field(default_factory=dict)
    #: aggregator slots (tasks) of the gateways' own plan, when they told us
    gateway_slots: int = 0
    #: the job's root node (it holds the global model and runs the top aggregator)
    root: str = ""
    #: the salt its root gateway drew at creation: its clients' tokens depend on it
    salt: str = ""
    #: clients revoked (never selected again; their tokens are refused)
    revoked: list[str] = field(default_factory=list)
    #: why the job failed (a round short of its minimum, no model after closing); "" if not
    failed: str = ""
    #: the robust rule its initial weights declare (``core.robust``), "" for FedAvg: such a
    #: job runs on its root node alone (the rule needs every update where it reduces them)
    rule: str = ""
    #: a DP-FedAvg job's accounting (:mod:`core.privacy`): its rule's ``noise_multiplier``,
    #: ``clip``, ``delta`` and budget ``epsilon`` (None: no budget), and ``spent``; {} without DP
    privacy: dict[str, Any] = field(default_factory=dict)
    #: the sampling rate of each round opened so far: each spent privacy once
    privacy_rates: list[float] = field(default_factory=list)
    #: why the job ended before its last round ("" if it did not): its privacy budget
    stopped: str = ""
    #: clients FLStore flagged (``drop_flagged``), dropped from every later round: client ->
    #: ``{"flagged_in": round, "workload": name}``
    flagged: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: acknowledged updates a node gateway reports in no published model (its job status's
    #: ``dropped``), per ``node/round/slot``: each counted once in its round's ``lost``
    dropped: dict[str, int] = field(default_factory=dict)
    #: the secure-aggregation parameters its initial weights declare
    #: (``core.secagg.config.SecAggConfig.to_spec``), {} without: its rounds run the stages of
    #: :mod:`control_plane.secagg`
    secagg: dict[str, Any] = field(default_factory=dict)

    def count_dropped(self, node: str, rnd: int, slot: int, updates: int) -> int:
        """Count ``updates`` acknowledged updates of slot ``slot`` that node ``node`` reports
        dropped in round ``rnd``, once: in the round's ``lost`` (the current round's, and, for
        an ended round, its ``history`` entry and ``totals``). Returns the updates newly
        counted (0 when that slot's drop was counted before)."""
        key = f"{node}/{rnd}/{slot}"
        if key in self.dropped or updates <= 0:
            return 0
        self.dropped[key] = updates
        cur = self.current
        if cur is not None and cur.number == rnd:
            cur.lost += updates
        if cur is None or cur.number != rnd or cur.closed_at is not None:  # ended: recorded
            for entry in self.history:
                if entry.get("round") == rnd:
                    entry["lost"] = int(entry.get("lost") or 0) + updates
            self.totals["lost"] = self.totals.get("lost", 0) + updates
        return updates

    def lost(self) -> int:
        """Acknowledged updates in no published model over the job so far (its ended rounds'
        and the open one's)."""
        cur = self.current
        open_ = cur.lost if cur is not None and cur.closed_at is None else 0
        return self.totals.get("lost", 0) + open_

    def record(self, entry: dict[str, Any]) -> None:
        """Append an ended round to ``history`` (dropping the oldest beyond
        :data:`HISTORY_ROUNDS`) and add it to ``totals``."""
        self.history.append(entry)
        del self.history[:-HISTORY_ROUNDS]
        t = self.totals
        t["rounds"] = t.get("rounds", 0) + 1
        for k in ("received", "aggregated", "lost"):
            t[k] = t.get(k, 0) + int(entry.get(k) or 0)

    def eligible(self) -> list[str]:
        """The job's clients less the revoked ones, in the spec's order."""
        gone = set(self.revoked)
        return [c for c in self.spec.clients if c not in gone]

    def selectable(self) -> list[str]:
        """The eligible clients less those FLStore flagged (``drop_flagged``)."""
        return [c for c in self.eligible() if c not in self.flagged]

    @property
    def done(self) -> bool:
        """All rounds ended, or the job was stopped before (:attr:`stopped`)."""
        return self.completed >= self.spec.rounds or bool(self.stopped)


@dataclass
class NodeHealth:
    """Health of one node gateway, as the coordinator sees it."""

    name: str
    url: str
    mc: float
    healthy: bool = True
    failures: int = 0
    #: when the current run of failed probes began (None while it answers)
    failing_since: float | None = None
    #: the name its certificate is verified against when not ``url``'s host: the node's own
    #: name for a gateway found through discovery (:mod:`core.server_names`)
    tls_name: str | None = None


def round_view(rnd: RoundInfo) -> dict[str, Any]:
    """JSON view of a round (assignment summarised per node)."""
    per_node: dict[str, int] = {}
    for n in rnd.assignment.values():
        per_node[n] = per_node.get(n, 0) + 1
    return {
        "number": rnd.number,
        "state": rnd.state,
        "goal": rnd.goal,
        "selected": len(rnd.selected),
        "clients_per_node": per_node,
        "received": dict(rnd.received),
        "lost": rnd.lost,
        "deadline_at": rnd.deadline_at,
        "opened_at": rnd.opened_at,
        "closed_at": rnd.closed_at,
        "plan_version": rnd.plan_version,
        "placement": rnd.placement,
        "published": rnd.published,
        "closing": rnd.closing,
        "closed_with": dict(rnd.closed_with),
        "reopened": rnd.reopened,
        "takeovers": rnd.takeovers,
        "resend": dict(rnd.resend),
        "selected_by": rnd.selected_by,
        "selection_note": rnd.selection_note,
        "excluded": dict(rnd.excluded),
        "drop_note": rnd.drop_note,
        "failures": dict(rnd.failures),
        "close_pending": rnd.close_pending,
        "frozen": sorted(rnd.close_counts),  # nodes that stopped their intake for the close
        "close_attempts": rnd.close_attempts,
        "close_error": rnd.close_error,
    }


def privacy_view(job: JobState) -> dict[str, Any] | None:
    """A DP-FedAvg job's accounting as its view shows it (None without DP)."""
    p = job.privacy
    if not p:
        return None
    return {
        "mechanism": "dp-fedavg",
        "noise_multiplier": p["noise_multiplier"],
        "clip": p["clip"],
        "delta": p["delta"],
        "budget": p.get("epsilon"),
        # spent by the rounds opened so far; without noise (z = 0) there is no bound: None
        "epsilon": spent if math.isfinite(spent := float(p.get("spent", 0.0))) else None,
        "unbounded": not math.isfinite(spent),
        "rounds": len(job.privacy_rates),
        "sampling_rates": sorted(set(job.privacy_rates)),
        "accountant": "dp-accounting RDP, Poisson-sampled Gaussian per round",
    }


def delivered_per_leaf(plan: Plan, received: Mapping[str, int]) -> dict[str, int]:
    """Updates a node accepted fill its leaves in order (the gateway's intake order)."""
    out: dict[str, int] = {}
    for n in plan.nodes:
        left = min(received.get(n.node, 0), n.expected)
        for k, g in zip(n.leaf_numbers, n.leaf_goals, strict=True):
            if left <= 0:
                break
            out[f"{n.node}:leaf:{k}"] = min(g, left)
            left -= g
    return out


def seed_of(job: str, number: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{job}/{number}".encode()).digest()[:8], "little")


def job_to_json(job: JobState) -> dict[str, Any]:
    return {
        "spec": asdict(job.spec),
        "completed": job.completed,
        "history": job.history,
        "totals": job.totals,
        "current": None if job.current is None else asdict(job.current),
        "gateway_client_nodes": job.gateway_client_nodes,
        "gateway_slots": job.gateway_slots,
        "root": job.root,
        "salt": job.salt,
        "revoked": job.revoked,
        "failed": job.failed,
        "rule": job.rule,
        "privacy": job.privacy,
        "privacy_rates": job.privacy_rates,
        "stopped": job.stopped,
        "flagged": job.flagged,
        "dropped": job.dropped,
        "secagg": job.secagg,
    }


def job_from_json(raw: Mapping[str, Any]) -> JobState:
    cur = raw.get("current")
    return JobState(
        JobSpec(**raw["spec"]),
        int(raw["completed"]),
        None if cur is None else RoundInfo(**cur),
        list(raw.get("history", [])),
        {str(k): int(v) for k, v in (raw.get("totals") or {}).items()},
        dict(raw.get("gateway_client_nodes", {})),
        int(raw.get("gateway_slots", 0)),
        str(raw.get("root", "")),
        str(raw.get("salt", "")),
        list(raw.get("revoked", [])),
        str(raw.get("failed", "")),
        str(raw.get("rule", "")),
        dict(raw.get("privacy") or {}),
        [float(q) for q in raw.get("privacy_rates") or ()],
        str(raw.get("stopped", "")),
        dict(raw.get("flagged") or {}),
        {str(k): int(v) for k, v in (raw.get("dropped") or {}).items()},
        dict(raw.get("secagg") or {}),
    )
