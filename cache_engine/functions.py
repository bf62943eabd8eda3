"""A cache function as the engine sees it (:class:`FunctionInfo`): what it holds, as it last
said, and what is on its way to it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FunctionInfo:
    """A cache function as the engine sees it."""

    name: str
    incarnation: str = ""
    used: int = 0
    alive: bool = True
    failures: int = 0
    created: float = field(default_factory=time.time)
    #: the replica's own address, from its /ping (None: reached through the gateway only)
    url: str | None = None
    #: bytes of loads under way to it (set aside by :meth:`Placement.ensure`)
    reserved: int = 0

    #: the loads and evictions it had done when it last said what it holds
    seq: int = -1

    @property
    def taken(self) -> int:
        """Bytes it holds, as it last said, and those on their way to it."""
        return self.used + self.reserved

    def said(self, body: dict[str, Any]) -> None:
        """The function's own word on what it holds (a load's, an eviction's or a ping's
        answer): taken unless an answer already seen was newer (answers to loads at once
        arrive in any order; an older one would undercount)."""
        seq = int(body.get("loads", 0)) + int(body.get("evictions", 0))
        if seq >= self.seq:
            self.seq = seq
            self.used = int(body.get("bytes", self.used))
