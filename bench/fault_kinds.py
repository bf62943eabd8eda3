"""The faults of the campaign (:mod:`bench.faults`): how each is injected into ``fedfaas up
--with all``, and the evidence that it hit work in flight.

Each :class:`Fault` has an injector (it returns what it did and saw, the fault's time in
``ended_at``) and an ``evidence`` verdict over the finished :class:`JobRun`: ``(hit, what)``.
A row counts only runs whose fault is shown to have reached the work it names: a replica
killed while it ran a slot, a gateway killed holding accepted updates of the open round, a
publication Redis refused, a partial that could not reach its root, uploads refused while
the store was full, queries answering across the kill of the part they ran on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.fault_disconnect import disconnects, disconnects_evidence
from bench.fault_platform import Campaign, JobRun
from bench.fault_shm import fill_store, shm_evidence

#: the job every fault acts on: clients (goal and selection), rounds
CLIENTS = 20
ROUNDS = 2
#: the queries in flight at FLStore's faults: FoolsGold over every round, all updates loaded
IN_FLIGHT = ("foolsgold", {"first_round": 1, "last_round": ROUNDS})

#: fault (m): the longest a publication is refused once Redis refused it the first time
REDIS_REFUSAL_S = 3.0


# --- the injectors ---------------------------------------------------------------------------


def _busy_slot(c: Campaign, job: str, timeout: float = 60.0) -> dict[str, Any] | None:
    """A leaf slot of ``job`` that an aggregator endpoint is running now (granted, not done)
    and that still waits for an update (:func:`waiting_leaves`; while work is wanted, the
    first ``timeout / 6`` s, one holding an update), its node and the pid of the replica that
    holds the endpoint (the router's record). None when none was seen.

    A slot with all its inputs in can finish between this look and the kill, which then hits
    a replica with nothing left to re-run: seen at 8004275 with a leaf holding all its
    updates, and once leaves were made to wait, with a top slot holding both of its partials.
    A middle or top slot's children are not in the job's progress, so only leaves, whose goal
    counts their updates, are chosen."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        need_work = time.monotonic() - t0 < timeout / 6
        found = []
        for node, url in c.nodes().items():
            progress = c.job_status(url, job).get("progress") or {}
            found += [(-s["updates"], node, url, sid, s) for sid, s in
                      waiting_leaves(node, progress.get("slots") or {}, need_work)]  # fmt: skip
        for _, node, url, sid, s in sorted(found, key=lambda x: x[:2]):
            r = httpx.get(f"{url}/v1/router", headers=c.admin, timeout=10, verify=c.verify)
            pids = {int(e["id"]): int(e["pid"]) for e in r.json()["endpoints"] if not e["local"]}
            pid = pids.get(int(s["endpoint"]))
            if pid is not None:
                return {
                    "node": node,
                    "slot": sid,
                    "role": "leaf",
                    "updates": s["updates"],  # waiting_leaves made it an int
                    "partials": int(s.get("partials", 0)),
                    "endpoint": int(s["endpoint"]),
                    "pid": pid,
                }
        time.sleep(0.005)
    return None


def waiting_leaves(
    node: str, slots: dict[str, Any], need_work: bool
) -> list[tuple[int, dict[str, Any]]]:
    """``(slot id, slot)`` of the leaves of a node's job progress ``slots`` that run on
    ``node``, have an endpoint, are not done and are short of their goal (with
    ``need_work``, that hold an update too)."""
    out = []
    for sid, s in slots.items():
        updates = int(s.get("updates", 0))
        running = s.get("endpoint") is not None and not s.get("done")
        short = int(s.get("goal", 0)) > updates
        leaf = int(s["role"]) == 1 and s.get("node") == node
        if leaf and running and short and (updates or not need_work):
            out.append((int(sid), {**s, "updates": updates}))
    return out


def _replica(c: Campaign, run: JobRun) -> dict[str, Any]:
    """SIGKILL the aggregator replica (its process group) that runs one of the job's slots;
    a ready replica at random when no slot was seen running (tiny updates fold in
    microseconds: the soak's)."""
    slot = _busy_slot(c, run.job)
    if slot is None:
        return {**c.kill_replica("aggregator"), "no_slot_seen": True}
    with contextlib.suppress(ProcessLookupError):  # the replica's whole process group
        os.killpg(os.getpgid(slot["pid"]), signal.SIGKILL)
    return {**slot, "ended_at": time.monotonic()}


def _replica_evidence(run: JobRun) -> tuple[bool, str]:
    i = run.injected
    if "slot" not in i:
        return False, "no busy slot found"
    again = run.grew("fedfaas_gateway_redeliveries", i["node"])
    return again >= 1, (
        f"pid {i['pid']} ran {i['role']} slot {i['slot']} on {i['node']} ({i['updates']} "
        f"update(s), {i.get('partials', 0)} partial(s) in it); slots re-run there: {again:g}"
    )


def _kill_gateway(c: Campaign, run: JobRun, node: str, timeout: float = 60.0) -> dict[str, Any]:
    """SIGKILL ``node``'s gateway once it holds an accepted update of a round it has not
    published (uploads go on meanwhile; at most ``timeout`` s); what it held just before."""
    url, deadline = c.nodes()[node], time.monotonic() + timeout
    while True:
        st = c.job_status(url, run.job)
        version, rnd = st.get("version"), st.get("round")
        in_flight = isinstance(version, int) and isinstance(rnd, int) and version < rnd
        if (in_flight and (st.get("received") or 0) >= 1) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    out = c.kill_part(c.part_of(node))
    out.update(
        node=node,
        round=st.get("round"),
        version=st.get("version"),
        received=st.get("received"),
    )
    return out


def _gateway(c: Campaign, run: JobRun) -> dict[str, Any]:
    root = c.cp_get(f"/v1/jobs/{run.job}")["root"]
    return _kill_gateway(c, run, next(n for n in c.nodes() if n != root))


def _root_gateway(c: Campaign, run: JobRun) -> dict[str, Any]:
    return _kill_gateway(c, run, c.cp_get(f"/v1/jobs/{run.job}")["root"])


def _held_updates_evidence(run: JobRun) -> tuple[bool, str]:
    """A gateway killed holding accepted updates of a round it had not published."""
    i = run.injected
    rnd, version, got = i.get("round"), i.get("version"), i.get("received") or 0
    hit = isinstance(rnd, int) and isinstance(version, int) and version < rnd and got >= 1
    return hit, (
        f"{i.get('node')} killed holding {got} accepted update(s) of round {rnd} "
        f"(its model version {version})"
    )


def _root_node(c: Campaign, run: JobRun) -> dict[str, Any]:
    """The job's root node lost for good: its gateway SIGKILLed while the supervisor is held
    (SIGSTOP: nothing restarts it) and its shared memory wiped, so the global model, the top
    aggregator and the updates it accepted are gone. Once another node has taken the job over
    (the control plane's view names a new root), the supervisor goes on and the node comes
    back empty, as a replacement node would, and rejoins the job as one of its nodes."""
    from fedfaas.platform import state

    node = c.cp_get(f"/v1/jobs/{run.job}")["root"]
    st = state.load(c.p.state_dir)
    assert st is not None
    memory = Path(st.shm_dir) / f"fedfaas-{c.p.platform_id[:12]}" / node
    supervisor = c.pid_of("supervisor")
    os.kill(supervisor, signal.SIGSTOP)
    try:
        out = _kill_gateway(c, run, node)
        shutil.rmtree(memory)
        deadline = time.monotonic() + 90
        while (view := c.cp_get(f"/v1/jobs/{run.job}"))["root"] == node:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no node took {run.job} over from {node} in 90 s")
            time.sleep(0.1)
        rnd = view["round"] or {}
        out.update(
            heir=view["root"],
            taken_over_s=round(time.monotonic() - out["ended_at"], 2),
            resend=len(rnd.get("resend") or {}),
        )
    finally:
        os.kill(supervisor, signal.SIGCONT)
    return out


def _root_node_evidence(run: JobRun) -> tuple[bool, str]:
    hit, what = _held_updates_evidence(run)
    i = run.injected
    return hit and "heir" in i, (
        f"{what}; {i.get('heir')} took the job over, {i.get('resend')} client(s) sent again"
    )


def _round_open_evidence(run: JobRun) -> tuple[bool, str]:
    """A platform part killed while a round had some but not all of its updates."""
    i = run.injected
    k, n = i.get("acked_at_fault", 0), i.get("clients", 0)
    return 0 < k < n, f"{i.get('part')} killed with {k} of {n} updates of round {i.get('round')} in"


def _redis_evidence(run: JobRun) -> tuple[bool, str]:
    hit, what = _round_open_evidence(run)
    tries = sum(v for d in run.counters.values() for k, v in d.items() if "journal_retries" in k)
    return hit, f"{what}; journal writes the gateways retried: {tries:g}"


def _minio(c: Campaign, run: JobRun) -> dict[str, Any]:
    """MinIO SIGSTOPped for ``minio_outage_s``: checkpoints of rounds published meanwhile wait."""
    pid = c.pid_of("minio")
    view0 = c.cp_get(f"/v1/jobs/{run.job}")
    os.kill(pid, signal.SIGSTOP)
    time.sleep(c.minio_outage_s)
    view1 = c.cp_get(f"/v1/jobs/{run.job}")
    os.kill(pid, signal.SIGCONT)
    return {
        "part": "minio",
        "pid": pid,
        "stopped_s": c.minio_outage_s,
        "published_while_stopped": int(view1["completed"]) - int(view0["completed"]),
        "ended_at": time.monotonic(),
    }


def _minio_evidence(run: JobRun) -> tuple[bool, str]:
    n = run.injected.get("published_while_stopped", 0)
    return n >= 1, f"{n} round(s) published while MinIO was stopped: their checkpoints waited"


def _query_evidence(run: JobRun) -> tuple[bool, str]:
    i = run.injected
    n = i.get("queries_at_fault", 0)
    return n >= 1, f"{n} queries in flight at the kill (of {i.get('queries', 0)} sent), answered"


def _cache_function(c: Campaign, run: JobRun) -> dict[str, Any]:
    """SIGKILL the cache function the in-flight query runs on: the primary holder of its
    objects (the engine's own placement, asked as the tracker asks it)."""
    from fedfaas.platform import credentials

    engine = c.p.urls["cache_engine"]
    auth = {"Authorization": f"Bearer {credentials.read(c.p.secrets, credentials.SERVICE_TOKEN)}"}
    kind, params = IN_FLIGHT
    deadline = time.monotonic() + 30
    while True:  # the query's objects are being loaded: wait for a holder
        plan = httpx.post(
            f"{engine}/v1/plan",
            json={"workload": kind, "job": run.job, "params": params},
            headers=auth,
            timeout=10,
            verify=c.verify,  # the engine requires a platform certificate over TLS
        ).json()
        where = httpx.get(
            f"{engine}/v1/locations",
            params={"ids": plan["objects"]},
            headers=auth,
            timeout=10,
            verify=c.verify,
        ).json()
        primary = where.get(plan["objects"][0]) or []
        if primary or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not primary:
        raise RuntimeError("no cache function holds the in-flight query's objects")
    return c.kill_replica(primary[0])


def fill_shm(c: Campaign, run: JobRun, phase: str) -> dict[str, Any]:
    """Fault (k)'s fill in ``phase`` (``creation``: round 1's uploads; ``mid_round``: the
    fault's round, the last): :func:`bench.fault_shm.fill_store`."""
    return fill_store(c, run, phase, 1 if phase == "creation" else ROUNDS, CLIENTS)


def _shm_full(c: Campaign, run: JobRun) -> dict[str, Any]:
    return fill_shm(c, run, "mid_round")


@contextlib.contextmanager
def _gateway_writes_refused(c: Campaign, writable: list[str]) -> Iterator[None]:
    """While inside, Redis refuses the ``gateway`` user's writes to every FedFaaS key but
    ``writable`` (globs): ``NOPERM``, as an ACL change makes it. The platform's rule is put
    back on the way out."""
    from core.secretfiles import redis_client
    from core.services import REDIS_USERS

    keys = next(r for r in REDIS_USERS["gateway"].split() if r.startswith("~"))
    url = c.p.urls["redis"].replace("http://", "redis://") + "/0"
    admin = redis_client(url, c.p.secrets / "redis-admin.json")
    try:
        rules = ["%R~fedfaas:*", *(f"%RW~{w}" for w in writable)]
        admin.execute_command("ACL", "SETUSER", "gateway", "resetkeys", *rules)  # type: ignore[no-untyped-call]
        yield
    finally:
        admin.execute_command("ACL", "SETUSER", "gateway", "resetkeys", keys)  # type: ignore[no-untyped-call]
        admin.close()


def _redis_publish(c: Campaign, run: JobRun) -> dict[str, Any]:
    """Redis refuses the job's publication (its state key turns read-only for the gateways)
    from just before the round's last update until the root has seen it refused, and
    :data:`REDIS_REFUSAL_S` more: the publication is retried, nothing is freed before it
    lands."""
    job = run.job
    writable = ["fedfaas:jobs", "fedfaas:job-id", f"fedfaas:job:{job}:round:*"]
    writable.append(f"fedfaas:job:{job}:revoked")
    root = c.cp_get(f"/v1/jobs/{job}")["root"]
    url = c.nodes()[root]
    from bench.fault_checks import gateway_counters

    name = "fedfaas_gateway_journal_retries{op=publish}"
    before = gateway_counters(url, c.admin, c.verify).get(name, 0.0)
    with _gateway_writes_refused(c, writable):
        run.injected_done.set()  # the held client uploads the round's last update now
        deadline = time.monotonic() + 60
        while gateway_counters(url, c.admin, c.verify).get(name, 0.0) <= before:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        refused_at = time.monotonic()
        time.sleep(REDIS_REFUSAL_S)
    return {
        "root": root,
        "publish_refused_for_s": round(time.monotonic() - refused_at, 2),
        "ended_at": time.monotonic(),
    }


def _redis_publish_evidence(run: JobRun) -> tuple[bool, str]:
    root = run.injected.get("root")
    tries = run.grew("fedfaas_gateway_journal_retries{op=publish}", root)
    return tries >= 1, f"the publication on {root} refused by Redis and retried {tries:g} time(s)"


def _partial_undeliverable(c: Campaign, run: JobRun) -> dict[str, Any]:
    """The root's gateway SIGKILLed just before the held client's update completes the other
    node's subtree: that node's partial is forwarded while the root is down (the supervisor
    restarts it) and must be retried until the root takes it."""
    out = _root_gateway(c, run)
    run.injected_done.set()  # the held client (on the other node) uploads now
    return out


def _partial_evidence(run: JobRun) -> tuple[bool, str]:
    root = run.injected.get("node")
    tries = sum(
        v
        for n, d in run.counters.items()
        if n != root
        for k, v in d.items()
        if k == "fedfaas_gateway_partial_retries"
    )
    return tries >= 1, f"root {root} down; partial forwards to it retried: {tries:g}"


@dataclass(frozen=True)
class Fault:
    """One fault of the campaign: its letter in issue 13's list (35's for m, n), what it
    does, when, and the evidence it hit work in flight."""

    letter: str
    name: str
    what: str
    inject: Callable[[Campaign, JobRun], dict[str, Any]]
    evidence: Callable[[JobRun], tuple[bool, str]]
    #: "upload": during a round's uploads; "query": during an FLStore query
    during: str = "upload"
    #: the platform keeps its object stores on a tmpfs of this many MiB of its own (None: the
    #: machine's /dev/shm)
    shm_cap_mib: int | None = None
    #: a client of the round uploads only once the fault is injected (``holds``: one on the
    #: job's root node, or on another node)
    holds: str = ""
    #: the fault goes in once this share of the round's updates are in (None: at random)
    at_share: float | None = None
    #: the model's layout: ResNet-18's (the data path) or 257 KiB (FLStore's queries)
    small_model: bool = False
    #: gateway settings of this fault's platform (environment of ``fedfaas up``)
    env: tuple[tuple[str, str], ...] = ()


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "a",
            "replica",
            "SIGKILL of an aggregator replica running a slot",
            _replica,
            _replica_evidence,
        ),
        Fault(
            "b", "gateway", "SIGKILL of a non-root node gateway", _gateway, _held_updates_evidence
        ),
        Fault(
            "c",
            "root-gateway",
            "SIGKILL of the job's root node gateway",
            _root_gateway,
            _held_updates_evidence,
        ),
        Fault(
            "c2",
            "root-node",
            "the job's root node lost: gateway SIGKILLed, not restarted until another node "
            "took the job over, its shared memory wiped",
            _root_node,
            _root_node_evidence,
            holds="root",
        ),
        Fault(
            "d",
            "runtime",
            "SIGKILL of the runtime",
            lambda c, r: c.kill_part("runtime"),
            _round_open_evidence,
        ),
        Fault(
            "e",
            "control-plane",
            "SIGKILL of the control plane",
            lambda c, r: c.kill_part("control-plane"),
            _round_open_evidence,
        ),
        Fault(
            "f",
            "cache-engine",
            "SIGKILL of the cache engine mid-query",
            lambda c, r: c.kill_part("cache-engine"),
            _query_evidence,
            during="query",
            small_model=True,
        ),
        Fault(
            "g",
            "cache-function",
            "SIGKILL of a cache function mid-query",
            _cache_function,
            _query_evidence,
            during="query",
            small_model=True,
        ),
        Fault(
            "h",
            "request-tracker",
            "SIGKILL of the request tracker, queries in flight",
            lambda c, r: c.kill_part("request-tracker"),
            _query_evidence,
            during="query",
            small_model=True,
        ),
        Fault(
            "i",
            "redis",
            "Redis restarted (SIGKILL)",
            lambda c, r: c.kill_part("redis"),
            _redis_evidence,
        ),
        Fault("j", "minio", "MinIO stopped (SIGSTOP) for 30 s, then back", _minio, _minio_evidence),
        Fault(
            "k",
            "shm-full",
            "the object stores' memory file system nearly full (a 4 GiB tmpfs remounted to "
            "8 MiB more than it holds, at the job's creation and mid round with 18 of its 20 "
            "uploads to come; held 5 s past the first refused upload, at most a minute, and "
            "not once the round has all its uploads; gateways keep at most one spare buffer, "
            "so every other upload needs new pages)",
            _shm_full,
            shm_evidence,
            holds="any",
            shm_cap_mib=4096,
            at_share=0.1,
            env=(("FEDFAAS_GATEWAY_POOL_MAX_BYTES", "1"),),
        ),
        Fault(
            "l",
            "disconnects",
            "a client disconnecting mid-upload, 100 times",
            disconnects,
            disconnects_evidence,
            holds="any",
        ),
        Fault(
            "m",
            "redis-publish",
            "Redis refusing the round's publication (the gateways' ACL loses the job's state "
            "key) from its last update until the root retried it, then 3 s more",
            _redis_publish,
            _redis_publish_evidence,
            holds="any",
            at_share=1.0,
        ),
        Fault(
            "n",
            "partial-undeliverable",
            "a partial undeliverable at the root: the root gateway SIGKILLed just before "
            "another node's last update completes that node's partial",
            _partial_undeliverable,
            _partial_evidence,
            holds="other",
            at_share=1.0,
        ),
    )
}
