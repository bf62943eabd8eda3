"""A round whose rule needs every update at once, run as coordinate shards on aggregator endpoints.

For a job with a robust rule (``core.robust``: median, trimmed mean, Krum, Multi-Krum,
FLTrust) or central DP (DP-FedAvg) the round's updates are not folded as they arrive: they stay in the node's store,
sealed, until the round holds its goal (or is closed with fewer). Then:

1. The gateway allocates the output object and splits the data region into S coordinate ranges
   (S: the rule's ``shards``, else one per endpoint registered here).
2. For Krum, Multi-Krum and FLTrust, a Gram pass: each shard computes ``(u_i - g).(u_j - g)``
   over its range and writes it into the pass's manifest; the gateway sums the S blocks and the
   rule picks a coefficient per update (Krum's scores and selection, FLTrust's trust scores).
   DP-FedAvg's Gram pass computes the diagonal only: the deltas' norms, hence each update's
   clipping factor over the round's goal.
3. A reducing pass: each shard writes its range of the result into the one output object (the
   median or trimmed mean of its range, or ``g + sum_i c_i (u_i - g)``, for DP-FedAvg plus its
   Gaussian noise), so the result is whole when the last shard answers; the gateway writes its
   header, seals it and publishes it.

A start the store refuses (``/dev/shm`` full: the output object or a pass's manifest) changes
nothing, as for a slot's accumulator (``gateway/rounds.py``): no object is held for it, the
refusal is logged and counted, and a pump (:meth:`ShardedRound.start_if_ready`, called at every
pump by ``gateway/endpoints.py``) asks the store again after
:data:`~gateway.slots.STORE_RETRY_S`; before its first pass the round stays open to a new plan
(a close with fewer), after the Gram pass its coefficients wait for the second pass's manifest.

Each pass is a manifest object (``core.shards``) named by SHARD frames; a shard is a pure
function of its inputs, so one whose endpoint disconnects, or that stays silent past the stall
limit, is sent again (to any free endpoint) and writes the same bytes. What was decided (the
rule, the inputs in order, Krum's scores and selection, FLTrust's trust scores, DP-FedAvg's
count of clipped updates, denominator, noise std and, when the job fixed one, its seed) goes
into the round's ``meta.json`` under ``aggregation``.

Across nodes: a job with one of these rules runs on one node (the gateway refuses more; the
control plane places all its clients on its root), so each update crosses the network once, from
its client to the node that reduces it. Per rule, what another node could reduce before that:
median and trimmed mean nothing short of the updates' values (or per-node sorted slices);
Krum, Multi-Krum and FLTrust the Gram blocks of their own updates, but the cross-node dot
products need the updates in one place; DP-FedAvg its clipped sum (norms are per update, the
sum is a sum). None of these per-node reductions is built: the job stays on its root.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bpf import Frame, Kind
from core import robust, shards, wire
from core.robust import RobustRule, RuleError
from gateway.replan import PlanConflict
from gateway.rounds import RoundEngine
from gateway.slots import Input, SlotState

log = logging.getLogger(__name__)

#: a pass to run: its kind, its coefficients (LINEAR) and DP-FedAvg's noise
PassSpec = tuple[int, list[float], robust.Noise | None]


@dataclass
class _StoreWait:
    """The aggregation's store refusals in a row (:class:`gateway.slots.StoreWait`)."""

    refusals: int = 0
    retry_ns: int = 0


class ShardedRound(RoundEngine):
    """:class:`~gateway.rounds.RoundEngine` whose slots only take updates; the aggregation is
    the sharded passes above, on endpoints the gateway hands in through :meth:`run_shards`."""

    def __init__(
        self,
        *,
        rule: RobustRule,
        spec: wire.ModelSpec,
        expected: int,
        base: Callable[[], bytes],
        width: Callable[[], int],
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.rule = rule
        self.spec = spec
        #: the job's goal: DP-FedAvg's fixed denominator (a round closed short keeps it)
        self.expected = expected
        self._base = base  # the key of the model the round started from, asked at the start
        self._width = width  # endpoints registered here: the default number of shards
        self.stage: int | None = None  # the running pass (shards.GRAM, ORDER, LINEAR)
        self.manifest: bytes | None = None
        self.out_key: bytes | None = None
        self.inputs: list[Input] = []
        self.base_key = b""
        self.bounds: list[int] = []
        self.queued: list[int] = []
        self.running: dict[int, tuple[int, int]] = {}  # shard -> (endpoint, sent at, ns)
        self.finished: set[int] = set()
        self.decision: dict[str, Any] = {}
        self.started_ns = 0
        self._current: shards.Pass | None = None
        self._next: PassSpec | None = None  # decided, waiting for the store's room
        # refusals of the output object and of a pass's manifest, counted apart: the output
        # given back after a refused manifest is no end of the manifest's refusals
        self._out_wait, self._pass_wait = _StoreWait(), _StoreWait()

    # -- the slot machinery only takes updates ----------------------------------------------
    def needs_endpoint(self) -> list[SlotState]:
        return []

    def busy_endpoints(self) -> set[int]:
        return {ep for ep, _ in self.running.values()}

    def add_update(self, client: str, key: bytes, weight: float) -> int:
        sid = super().add_update(client, key, weight)
        self.start_if_ready()
        return sid

    def check_plan(self, plan: Any) -> None:
        if self.stage is not None:
            raise PlanConflict(f"round {self.round} is aggregating its {len(self.inputs)} updates")
        super().check_plan(plan)

    def apply_plan(self, plan: Any, version: int | None = None) -> list[int]:
        restarted = super().apply_plan(plan, version)
        self.start_if_ready()
        return restarted

    def rerun_stalled(self, stall_s: float, now_ns: int | None = None) -> list[int]:
        """Send again every shard silent for ``stall_s`` (a lost frame; the shard is pure)."""
        if stall_s <= 0 or self.result is not None:
            return []
        now = time.monotonic_ns() if now_ns is None else now_ns
        late = [s for s, (_, t) in self.running.items() if now - t > stall_s * 1e9]
        for s in late:
            ep, _ = self.running[s]
            log.warning(
                "round %d: shard %d silent on endpoint %d; sending it again", self.round, s, ep
            )
            self._send_shard(s, ep)
        return late

    def on_disconnect(self, ep: int) -> list[int]:
        lost = sorted(s for s, (e, _) in self.running.items() if e == ep)
        for s in lost:
            del self.running[s]
            self.queued.append(s)
        if lost:
            log.warning(
                "round %d: endpoint %d gone, shards %s will run again", self.round, ep, lost
            )
        return lost

    # -- shards ---------------------------------------------------------------------------
    def pending(self) -> int:
        """The node's queue: shards waiting for an endpoint (held updates are no work yet)."""
        return self.wanted()

    def wanted(self) -> int:
        """Shards waiting for an endpoint."""
        return len(self.queued) if self.result is None else 0

    def run_shards(self, endpoints: list[int]) -> None:
        """Give waiting shards these endpoints (granted this job), one shard each."""
        while self.queued and endpoints and self.result is None:
            self._send_shard(self.queued.pop(0), endpoints.pop(0))

    def _send_shard(self, shard: int, ep: int) -> None:
        assert self.manifest is not None and self.stage is not None
        self.running[shard] = (ep, time.monotonic_ns())
        self._send(
            Frame(
                dst=ep,
                src=self.gateway_ep,
                kind=Kind.SHARD,
                flags=self.stage,
                job=self.job_id,
                key=self.manifest,
                round=self.round,
                seq=shard,
            )
        )

    work_unit = "shard"  # a FAILED frame's seq: a shard, re-sent once silent (rerun_stalled)

    def on_frame(self, f: Frame) -> None:
        if f.kind != Kind.SHARD_DONE:
            return super().on_frame(f)
        if f.round != self.round or f.key != self.manifest or f.flags != self.stage:
            log.debug("round %d: stale SHARD_DONE for shard %d", self.round, f.seq)
            return
        if self.running.get(f.seq, (None, 0))[0] != f.src:
            return  # a shard sent again elsewhere meanwhile; the other answer counts
        del self.running[f.seq]
        self.finished.add(f.seq)
        if len(self.finished) == len(self.bounds) - 1:
            self._pass_done()

    # -- the passes -----------------------------------------------------------------------
    def start_if_ready(self) -> None:
        """Start the aggregation once the round holds its goal, or the pass the store
        refused room for (see the module docstring). Never raises for a full store."""
        if self.result is not None or self.closed:
            return
        if self._next is not None:
            self._start_pass(*self._next)
            return
        if self.stage is not None or self.accepted == 0 or self.accepted < self.plan.goal:
            return
        if time.monotonic_ns() < self._pass_wait.retry_ns:
            return  # its manifest was refused a moment ago: no output taken and given back
        out = self._allocate(self._out_wait, "the aggregation", "output object")
        if out is None:
            return
        self.started_ns = time.monotonic_ns()
        order = sorted(
            (inp for st in self.intake for inp in st.updates), key=lambda i: i.client or ""
        )
        self.inputs = order
        self.base_key = self._base()
        n_coords = (self.spec.object_nbytes - wire.HEADER_SIZE) // 4
        self.bounds = robust.shard_bounds(n_coords, self.rule.shards or max(1, self._width()))
        self.out_key = out
        clients = [i.client for i in order]
        self.decision = {
            "rule": self.rule.to_json(),
            "shards": len(self.bounds) - 1,
            "clients": clients,
        }
        skipped: str | None = None
        kind = shards.GRAM if self.rule.uses_gram else shards.ORDER
        try:
            self.rule.check_count(len(order))
        except RuleError as exc:  # nothing the rule can judge: a pass that keeps the model
            skipped, kind = str(exc), shards.LINEAR
        if not self._start_pass(kind, [0.0] * len(order) if skipped else []):
            # no manifest: the output goes back too, so a refused start holds no object
            self._next, self.out_key = None, None
            self.store.release(out)
            return
        self.retired.append(out)  # freed at the round's close unless published
        if skipped is not None:
            # the model stays as it was, and meta.json says why
            log.error("round %d: %s; the model stays as it was", self.round, skipped)
            self.decision["skipped"] = skipped
            return
        log.info(
            "round %d: %s over %d updates in %d shards",
            self.round,
            self.rule.rule,
            len(order),
            len(self.bounds) - 1,
        )

    def _noise_seed(self) -> int:
        """The round's noise seed: from the job's ``seed`` and the round (recorded in
        ``meta.json`` and the log), else 128 bits of OS entropy (recorded nowhere)."""
        if self.rule.seed is None:
            log.info("round %d: dp-fedavg noise seeded from OS entropy", self.round)
            return secrets.randbits(128)
        words = np.random.SeedSequence([self.rule.seed, self.round]).generate_state(4, np.uint32)
        seed = int.from_bytes(words.astype("<u4").tobytes(), "little")
        self.decision["noise_seed"] = str(seed)
        log.info(
            "round %d: dp-fedavg noise seed %d (job seed %d)", self.round, seed, self.rule.seed
        )
        return seed

    def _start_pass(self, kind: int, coef: list[float], noise: robust.Noise | None = None) -> bool:
        """Write pass ``kind``'s manifest and queue its shards; False when the store refused
        the manifest (the pass stays in ``_next``, asked again by :meth:`start_if_ready`)."""
        assert self.out_key is not None
        p = shards.Pass(
            kind,
            self.rule.to_json(),
            [i.key for i in self.inputs],
            self.base_key,
            self.out_key,
            self.bounds,
            coef,
            noise,
        )
        key = self._allocate(self._pass_wait, "the aggregation", "pass manifest", p.nbytes())
        if key is None:
            self._next = (kind, coef, noise)
            return False
        with self.store.open_writable(key) as obj:
            p.write(obj.buf)
        self.manifest = key
        self.retired.append(key)  # freed when the round closes
        self._next = None
        self.stage = kind
        self.queued = list(range(p.shards))
        self.running.clear()
        self.finished.clear()
        self._current = p
        return True

    def _pass_done(self) -> None:
        if self.stage == shards.GRAM:
            assert self.manifest is not None
            with self.store.open(self.manifest) as man:
                assert self._current is not None
                gram = shards.results(man.buf, self._current).sum(axis=0)
            clients = self.decision["clients"]
            root = None
            if self.rule.rule == "fltrust":
                root = next((i for i, c in enumerate(clients) if c == self.rule.root_client), None)
            choice = robust.coefficients(
                self.rule, gram, [i.weight for i in self.inputs], root=root, expected=self.expected
            )
            self.decision.update(_named(choice.detail, clients))
            noise = None
            if self.rule.rule == "dp-fedavg":
                noise = robust.Noise(float(choice.detail["noise_std"]), self._noise_seed())
            self._start_pass(shards.LINEAR, [float(c) for c in choice.coef], noise)
            return
        self._finish()

    def _finish(self) -> None:
        assert self.out_key is not None and self._current is not None
        coef = self._current.coef
        used = (
            [i for i, c in zip(self.inputs, coef, strict=True) if c != 0.0]
            if self.stage == shards.LINEAR
            else self.inputs
        )
        weight, count = float(sum(i.weight for i in used)), len(used)
        self.decision["aggregated"] = [i.client for i in used]
        self.decision["seconds"] = round((time.monotonic_ns() - self.started_ns) / 1e9, 6)
        with self.store.open_writable(self.out_key) as out:
            wire.write_object_header(
                out.buf,
                kind=wire.KIND_GLOBAL,
                spec_hash=self.spec.hash,
                data_nbytes=self.spec.object_nbytes - wire.HEADER_SIZE,
                weight=weight,
                count=count,
                round=self.round,
            )
        self.store.seal(self.out_key)
        self.stage = None
        self.result = Input(self.out_key, weight, count)
        # the updates stay until the round closes, once its result is journaled as the next
        # model (gateway.publish): a restart before that reduces them again
        log.info(
            "round %d: %s done in %.1f ms (%d of %d updates weigh in)",
            self.round,
            self.rule.rule,
            self.decision["seconds"] * 1e3,
            count,
            len(self.inputs),
        )
        self._publish(self.result)

    def progress(self) -> dict[str, object]:
        out = super().progress()
        out["aggregation"] = {
            "rule": self.rule.rule,
            "pass": shards.PASSES.get(self.stage or 0),
            "shards": len(self.bounds) - 1 if self.bounds else None,
            "queued": len(self.queued),
            "running": len(self.running),
        }
        return out


def _named(detail: dict[str, Any], clients: list[str | None]) -> dict[str, Any]:
    """Krum's, FLTrust's and DP-FedAvg's per-input figures keyed by client name, for
    ``meta.json``."""
    out: dict[str, Any] = {}
    if "norms" in detail:  # DP: how many were clipped, never whose norm was what
        out["clipped"] = len(detail["clipped"])
        out["denominator"] = detail["denominator"]
        out["noise_std"] = detail["noise_std"]
    if "scores" in detail:
        out["scores"] = dict(zip(clients, detail["scores"], strict=True))
        out["selected"] = [clients[i] for i in detail["selected"]]
    if "trust" in detail:
        out["trust"] = {
            c: t
            for i, (c, t) in enumerate(zip(clients, detail["trust"], strict=True))
            if i != detail["root"]
        }
        out["root"] = None if detail["root"] is None else clients[detail["root"]]
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}
