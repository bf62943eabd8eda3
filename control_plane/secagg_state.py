"""One secure-aggregation round's stages on the control plane, and how its store keeps them.

:class:`StageRound` is what :mod:`control_plane.secagg_stages` holds of a round: the server's
SecAgg+ state (:class:`core.secagg.coordinator.Coordinator`), when each stage opened, the
survivors' unmask messages and whether the root got its material. :meth:`StageRound.to_record`
and :meth:`StageRound.from_record` write it to the control plane's store (JSON, one record per
job, :func:`record_key`) and read it back after a restart.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator as SecAggCoordinator


def record_key(job: str) -> str:
    """The store's record of ``job``'s open round's stages."""
    return f"secagg:{job}"


@dataclass
class StageRound:
    """One round's stages: the server's SecAgg+ state and when each stage opened."""

    cfg: SecAggConfig
    server: SecAggCoordinator
    #: the job's salt when the round was made: a job deleted and created again under the same
    #: name is another job, whose round starts afresh
    salt: str = ""
    first_advert: float | None = None
    roster_at: float | None = None
    shares_closed: bool = False
    #: the root's answer: whose vectors the sum holds, and when it came
    unmask_at: float | None = None
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the unmask material is fixed: every survivor answered, the shares in hand rebuild every
    #: seed (:meth:`Coordinator.can_unmask`), or the stage timed out
    enough: asyncio.Event = field(default_factory=asyncio.Event)
    sender: asyncio.Task[None] | None = None
    #: the material went to the root (a restarted control plane does not send it again)
    sent: bool = False
    #: changed since it was last written to the store
    dirty: bool = False
    saving: asyncio.Lock = field(default_factory=asyncio.Lock)

    def to_record(self, number: int) -> dict[str, Any]:
        """The round's stages as the store keeps them (plain JSON; the job's salt tells this
        job's round from one of an earlier job of the same name)."""
        return {
            "salt": self.salt,
            "round": number,
            "server": self.server.to_state(),
            "advertising": self.first_advert is not None,
            "roster": self.roster_at is not None,
            "shares_closed": self.shares_closed,
            "unmask": self.unmask_at is not None,
            "messages": self.messages,
            "sent": self.sent,
        }

    @classmethod
    def from_record(
        cls, cfg: SecAggConfig, ctx: bytes, rec: dict[str, Any], now: float
    ) -> StageRound:
        """The round :meth:`to_record` kept, its open stage's clock started at ``now``
        (:class:`MessageError` or :class:`RoundFailed` for a record that does not hold)."""
        st = cls(cfg, SecAggCoordinator.from_state(cfg, ctx, rec["server"]), str(rec["salt"]))
        st.first_advert = now if rec["advertising"] else None
        st.roster_at = now if rec["roster"] else None
        st.shares_closed = bool(rec["shares_closed"])
        st.unmask_at = now if rec["unmask"] else None
        st.messages = dict(rec["messages"])
        st.sent = bool(rec["sent"])
        if st.sent or (
            st.unmask_at is not None
            and (set(st.messages) >= st.server.masked or st.server.can_unmask())
        ):
            st.enough.set()
        return st
