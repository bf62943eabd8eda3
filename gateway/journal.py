"""The Redis journal: jobs (with their salts), numeric job ids, accepted updates per round,
published versions, revoked clients, and which node is each job's root.

An update answered 202 has its record here (one per client and round, which is also what
refuses the same client twice across node gateways), so it counts exactly once; an async job's
buffer takes at most its ``K`` records, over all nodes. A record names its update's object
(``key``, unguessable), so writing it is idempotent: the same write again, after a try whose
answer was lost (the connection broke after Redis took it), answers written, not duplicate. :meth:`Journal.unaccept` removes a record only
while it names the object it is given.

A round's slot records (finished partials, checkpoints) are kept per node, ``<node>/<slot>``:
a slot's partial is journaled by the node that ran it and again by the root that received it,
each naming an object of its own store. The root's record is also how a node learns that the
root had its partial (:mod:`gateway.forward`).

A job exists while ``fedfaas:jobs`` holds its record: :meth:`Journal.delete_job` (the root's
``DELETE``) removes it, and every node that still has the job forgets it, and frees its
objects, at its next read of the journal (every ~0.2 s, and when it starts), also a node that
could not be reached when the job was deleted.

A job's root node is the first of its ``nodes`` in its metadata. :meth:`Journal.take_root`
moves it (a node takes over from a dead root) with a compare-and-set, and
:meth:`Journal.publish` is fenced by it: a root that was replaced (a partitioned gateway
that comes back) can publish no version any more.
"""

from __future__ import annotations

import json
from enum import IntEnum
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from core.secretfiles import async_redis_client

PREFIX = "fedfaas:"

#: client ARGV[1]'s record ARGV[2] (naming object ARGV[4]) unless it has one: 1 written, or
#: this very record is there already (a try whose answer was lost); 0 another record is there
#: (a duplicate); -1 the round holds ARGV[3] records already (ARGV[3] > 0: an async buffer)
_ACCEPT = """
local have = redis.call('HGET', KEYS[1], ARGV[1])
if have then
  if cjson.decode(have)['key'] == ARGV[4] then return 1 end
  return 0
end
local cap = tonumber(ARGV[3])
if cap > 0 and redis.call('HLEN', KEYS[1]) >= cap then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

#: client ARGV[1]'s record, only while it names object ARGV[2]: 1 removed, 0 not there
_UNACCEPT = """
local have = redis.call('HGET', KEYS[1], ARGV[1])
if have and cjson.decode(have)['key'] == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


class Accepted(IntEnum):
    """What :meth:`Journal.accept` did."""

    OK = 1
    DUPLICATE = 0
    FULL = -1


class NotRoot(Exception):
    """This node is not (any more) the job's root: it may not publish or take over."""


class Journal:
    """Async access to the journal keys (one Redis shared by all node gateways)."""

    def __init__(self, url: str, credentials_file: Path | None) -> None:
        """Connect to ``url`` as the user in ``credentials_file`` (required; read now)."""
        self.url = url
        self.r: aioredis.Redis = async_redis_client(url, credentials_file)
        self._accept = self.r.register_script(_ACCEPT)  # EVALSHA after the first
        self._unaccept = self.r.register_script(_UNACCEPT)

    async def close(self) -> None:
        await self.r.aclose()

    async def new_job_id(self) -> int:
        return int(await self.r.incr(PREFIX + "job-id"))

    async def create_job(self, name: str, meta: dict[str, Any]) -> bool:
        """Store a job's metadata; False if the name is taken."""
        return bool(await self.r.hsetnx(PREFIX + "jobs", name, json.dumps(meta)))

    async def job(self, name: str) -> dict[str, Any] | None:
        raw = await self.r.hget(PREFIX + "jobs", name)
        return None if raw is None else dict(json.loads(raw))

    async def jobs(self) -> dict[str, dict[str, Any]]:
        raw = await self.r.hgetall(PREFIX + "jobs")
        return {k.decode() if isinstance(k, bytes) else k: json.loads(v) for k, v in raw.items()}

    async def revoke(self, job: str, client: str) -> None:
        """Record that ``client`` of ``job`` is revoked (idempotent; gone with the job)."""
        await self.r.sadd(f"{PREFIX}job:{job}:revoked", client)

    async def revoked(self, jobs: list[str]) -> dict[str, set[str]]:
        """Revoked clients of each of ``jobs`` (one round trip)."""
        async with self.r.pipeline(transaction=False) as p:
            for job in jobs:
                p.smembers(f"{PREFIX}job:{job}:revoked")
            raw = await p.execute()
        return {
            job: {m.decode() if isinstance(m, bytes) else m for m in members}
            for job, members in zip(jobs, raw, strict=True)
        }

    async def accept(
        self, job: str, round: int, client: str, record: dict[str, Any], *, cap: int = 0
    ) -> Accepted:
        """Journal one accepted update, ``record`` (its object's ``key`` among its fields):
        :attr:`Accepted.DUPLICATE` if this client already has another record in this round;
        with ``cap`` (an async job's buffer size), :attr:`Accepted.FULL` once the round holds
        ``cap`` updates over all nodes (checked and written in one script, so concurrent
        uploads on several gateways never pass it). Idempotent: the same record again, after
        a try whose answer was lost, is :attr:`Accepted.OK`."""
        key = f"{PREFIX}job:{job}:round:{round}"
        args = [client, json.dumps(record), cap, record["key"]]
        return Accepted(int(await self._accept(keys=[key], args=args)))

    async def unaccept(self, job: str, round: int, client: str, key: str) -> bool:
        """Remove ``client``'s record of ``round`` if it names object ``key`` (hex); whether
        it did. Idempotent, and never removes a record another upload wrote meanwhile."""
        got = await self._unaccept(keys=[f"{PREFIX}job:{job}:round:{round}"], args=[client, key])
        return bool(got)

    async def round_record(self, job: str, round: int, client: str) -> dict[str, Any] | None:
        """``client``'s record of ``round`` (None: it has none)."""
        raw = await self.r.hget(f"{PREFIX}job:{job}:round:{round}", client)
        return None if raw is None else dict(json.loads(raw))

    async def round_updates(self, job: str, round: int) -> dict[str, dict[str, Any]]:
        raw = await self.r.hgetall(f"{PREFIX}job:{job}:round:{round}")
        return {k.decode() if isinstance(k, bytes) else k: json.loads(v) for k, v in raw.items()}

    async def slot_done(
        self, job: str, round: int, slot: int, record: dict[str, Any], *, node: str
    ) -> None:
        """Journal a finished slot's sealed partial (and the clients it covers) as ``node``
        holds it: the node that ran the slot, or the root that received it from there (each
        node's record names an object of its own store, so each has its own field)."""
        await self.r.hset(
            f"{PREFIX}job:{job}:round:{round}:slots", f"{node}/{slot}", json.dumps(record)
        )

    async def slot_checkpoint(
        self, job: str, round: int, slot: int, record: dict[str, Any], *, node: str
    ) -> None:
        """Journal an unfinished slot's latest sealed checkpoint (and the children it covers)."""
        await self.r.hset(
            f"{PREFIX}job:{job}:round:{round}:checkpoints", f"{node}/{slot}", json.dumps(record)
        )

    async def checkpoints(self, job: str, round: int, node: str) -> dict[int, dict[str, Any]]:
        """``node``'s journaled slot checkpoints of ``round``: slot id -> record."""
        return _of_node(await self.r.hgetall(f"{PREFIX}job:{job}:round:{round}:checkpoints"), node)

    async def save_plan(
        self, job: str, round: int, node: str, record: dict[str, Any] | None
    ) -> None:
        """The plan a node runs for a round (pushed or shrunk), so a restart resumes it."""
        key = f"{PREFIX}job:{job}:round:{round}:plans"
        if record is None:
            await self.r.hdel(key, node)
        else:
            await self.r.hset(key, node, json.dumps(record))

    async def plan(self, job: str, round: int, node: str) -> dict[str, Any] | None:
        raw = await self.r.hget(f"{PREFIX}job:{job}:round:{round}:plans", node)
        return None if raw is None else dict(json.loads(raw))

    async def done_slots(self, job: str, round: int, node: str) -> dict[int, dict[str, Any]]:
        """``node``'s journaled finished slots of ``round``: slot id -> record."""
        return _of_node(await self.r.hgetall(f"{PREFIX}job:{job}:round:{round}:slots"), node)

    async def publish(self, job: str, version: int, record: dict[str, Any], *, root: str) -> None:
        """Record a new global model version (monotonic) published by node ``root``, and
        forget the round before the one it ends: its updates, slots, checkpoints and plans.
        A restart resumes the next round, which reads the ended round's plans (was the job
        planned by the control plane?), and its ``meta.json`` is written from the ended
        round's updates; nothing reads older rounds, so the journal stays the size of two
        rounds however long the job runs.

        Raises :class:`NotRoot` when ``root`` is not the job's root node any more (another
        node took the job over): nothing is written.
        """
        key = f"{PREFIX}job:{job}:state"
        old = f"{PREFIX}job:{job}:round:{version - 1}"
        while True:
            async with self.r.pipeline(transaction=True) as p:
                try:
                    await p.watch(PREFIX + "jobs")
                    raw = await p.hget(PREFIX + "jobs", job)
                    if raw is None or json.loads(raw)["nodes"][0] != root:
                        raise NotRoot(f"node {root} is not the root of job {job!r}")
                    p.multi()  # type: ignore[no-untyped-call]
                    p.hset(key, mapping={"version": version, "global": json.dumps(record)})
                    if version >= 2:
                        p.delete(old, f"{old}:slots", f"{old}:checkpoints", f"{old}:plans")
                    await p.execute()
                    return
                except WatchError:
                    continue  # another job changed meanwhile: read again

    async def take_root(
        self,
        job: str,
        old: str,
        new: str,
        version: int,
        record: dict[str, Any],
        *,
        since: int | None = None,
    ) -> dict[str, Any]:
        """Make ``new`` the root of ``job`` in place of ``old``, at model ``version`` whose
        object on ``new`` is ``record`` (a compare-and-set: the root must still be ``old`` and
        the version unchanged). Returns the job's new metadata; ``old`` stays one of its
        nodes, last. ``since`` (an async job): the oldest version its updates may train on now.

        Raises :class:`NotRoot` when the root is not ``old`` any more, or the version moved.
        """
        key = f"{PREFIX}job:{job}:state"
        while True:
            async with self.r.pipeline(transaction=True) as p:
                try:
                    await p.watch(PREFIX + "jobs", key)
                    raw = await p.hget(PREFIX + "jobs", job)
                    have = await p.hget(key, "version")
                    meta = None if raw is None else dict(json.loads(raw))
                    if meta is None or meta["nodes"][0] != old or new not in meta["nodes"]:
                        raise NotRoot(
                            f"node {old} is not the root of job {job!r} (or {new} "
                            "is not one of its nodes)"
                        )
                    if int(have or 0) != version:
                        raise NotRoot(f"job {job!r} is at version {int(have or 0)}, not {version}")
                    meta["nodes"] = (
                        [new] + [n for n in meta["nodes"] if n not in (new, old)] + [old]
                    )
                    if since is not None:
                        meta["since"] = since
                    p.multi()  # type: ignore[no-untyped-call]
                    p.hset(PREFIX + "jobs", job, json.dumps(meta))
                    p.hset(key, "global", json.dumps(record))
                    await p.execute()
                    return meta
                except WatchError:
                    continue

    async def forget_updates(self, job: str, round: int, node: str) -> list[str]:
        """Drop the journal records of ``round``'s updates accepted on ``node`` (a node whose
        memory is gone: they were never aggregated); returns their clients, who may upload
        again (``HSETNX`` lets them)."""
        recs = await self.round_updates(job, round)
        gone = sorted(c for c, rec in recs.items() if rec.get("node") == node)
        if gone:
            await self.r.hdel(f"{PREFIX}job:{job}:round:{round}", *gone)
        return gone

    async def global_record(self, job: str) -> dict[str, Any] | None:
        raw = await self.r.hget(f"{PREFIX}job:{job}:state", "global")
        return None if raw is None else dict(json.loads(raw))

    async def delete_job(self, job: str) -> None:
        keys = [k async for k in self.r.scan_iter(match=f"{PREFIX}job:{job}:*")]
        async with self.r.pipeline(transaction=True) as p:
            p.hdel(PREFIX + "jobs", job)
            for k in keys:
                p.delete(k)
            await p.execute()

    async def version(self, job: str) -> int:
        raw = await self.r.hget(f"{PREFIX}job:{job}:state", "version")
        return int(raw) if raw is not None else 0


def _of_node(raw: dict[Any, Any], node: str) -> dict[int, dict[str, Any]]:
    """The ``<node>/<slot>`` fields of a slot hash that are ``node``'s, by slot id."""
    out: dict[int, dict[str, Any]] = {}
    for k, v in raw.items():
        owner, _, slot = (k.decode() if isinstance(k, bytes) else k).partition("/")
        if owner == node:
            out[int(slot)] = json.loads(v)
    return out
