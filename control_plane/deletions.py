"""Telling the gateways that a job is gone, until every one of them has heard it.

A job deleted (``DELETE /v1/jobs/{job}``) or failed (its live state dropped) must leave no
gateway holding it: its objects stay in that node's shared memory, and a gateway that still
knows the job keeps answering for it. A gateway that cannot be reached at that moment (down,
paused, cut off) is told again once it answers its health probe: the nodes still to be told
are kept per job (:attr:`CoordinatorBase.deletions`: its root and the nodes not told yet) in the state store (record
:data:`RECORD`), so a restarted control plane goes on telling them.

The order matters where the root is reached: the job's other nodes first, its root last (the
root deletes the journal the others would load the job from). A root told late deletes the
journal then, and the other nodes, which forgot that incarnation of the job, do not load it
again. A job created again under the name of one still being deleted replaces it: the
gateways drop the old incarnation when their journal names a new one, so nothing is owed.
"""

from __future__ import annotations

import logging

from control_plane.base import CoordinatorBase
from control_plane.errors import ControlPlaneError

log = logging.getLogger(__name__)

#: the state store's record of the gateways still to be told of deletions
RECORD = "deletions"


class GatewayCleanup(CoordinatorBase):
    """Deletes jobs on the gateways and tells the ones it could not reach later."""

    async def load_deletions(self) -> None:
        """Read the deletions still owed from the state store (at start)."""
        raw = await self.store.load_record(RECORD) or {}
        for job, rec in (raw.get("jobs") or {}).items():
            if isinstance(rec, dict) and isinstance(rec.get("nodes"), list) and rec["nodes"]:
                self.deletions[str(job)] = {
                    "root": str(rec.get("root", "")),
                    "nodes": [str(n) for n in rec["nodes"]],
                }
        if self.deletions:
            log.info("gateways still to be told of deleted jobs: %s", self.deletions)

    async def _save_deletions(self) -> None:
        await self.store.save_record(RECORD, {"jobs": self.deletions})

    async def delete_on_gateways(self, name: str, root: str) -> None:
        """Delete job ``name`` on every known node, the others before its ``root``; the
        nodes not reached now are owed the deletion (see the module). Call it holding the
        job's lock."""
        self.deletions[name] = {"root": root, "nodes": sorted(self.nodes)}
        await self._save_deletions()
        await self._tell(name)

    def forget_deletion(self, name: str) -> None:
        """A job created again as ``name``: the deletion of its old incarnation is not owed
        any more (the gateways drop it when they read the new one). Saved with the next
        change of the record."""
        self.deletions.pop(name, None)

    async def retry_deletions(self) -> None:
        """Tell the nodes that answer again of the deletions they missed."""
        for name in list(self.deletions):
            lock = self.job_lock(name)
            if lock.locked():  # that job's other step first; tried again at the next tick
                continue
            async with lock:
                if name in self.deletions:
                    await self._tell(name)

    async def _tell(self, name: str) -> None:
        """Delete ``name`` on the owed nodes whose last probe answered: the others at once,
        then the root."""
        rec = self.deletions.get(name)
        if rec is None:
            return
        root, owed = rec["root"], list(rec["nodes"])
        reach = set(self.answering_nodes()) & set(self.clients) & set(owed)
        done: list[str] = []
        for step in (
            [n for n in owed if n in reach and n != root],
            [root] if root in reach else [],
        ):
            for n, ans in (await self.on_nodes(step, lambda c: c.delete_job(name))).items():
                if isinstance(ans, ControlPlaneError):
                    log.warning("job %s: not deleted on %s yet: %s", name, n, ans.detail)
                else:
                    done.append(n)
        left = [n for n in owed if n not in done]
        if left:
            rec["nodes"] = left
            log.info("job %s: still to be deleted on %s", name, ", ".join(left))
        else:
            del self.deletions[name]
        if done:
            await self._save_deletions()
