"""Object keys of the FLStore cache: what a cache function can hold.

Three kinds of object exist per job and round: a client's update ``(job, client, round)``, the
round's global model ``(job, round, "global")`` and the round's metadata ``(job, round, "meta")``
(hyperparameters, selected clients, sample counts, losses, durations).

A model (an update or a global) may also be held in coordinate parts: part ``s`` of ``S`` is
the slice ``flstore_workloads.sliced.part_bounds(d, S)[s]`` of its flat vector, the key
``ObjectKey(job, round, kind, client, part=s, parts=S)`` with id ``<...>~<s>.<S>`` (``~`` is in
no job or client name). A round too large for one cache function is held that way, each
function holding the same part of every object (``cache_engine.parts``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["update", "global", "meta"]
KINDS: tuple[str, ...] = ("update", "global", "meta")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def valid_name(name: str) -> bool:
    """Whether ``name`` is a safe job or client id (letters, digits, ``_ . -``; max 128)."""
    return bool(_NAME.match(name))


@dataclass(frozen=True, order=True)
class ObjectKey:
    """One cacheable object.

    Attributes
    ----------
    job
        Job name.
    round
        Training round (>= 0).
    kind
        ``"update"`` (one client's weights), ``"global"`` or ``"meta"``.
    client
        Client id for updates, ``""`` otherwise.
    part, parts
        Part ``part`` of ``parts`` of a model's vector; ``parts == 0``: the whole object.
    """

    job: str
    round: int
    kind: str = "update"
    client: str = ""
    part: int = 0
    parts: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "update") != bool(self.client):
            raise ValueError("updates need a client id; global and meta objects have none")
        if self.round < 0:
            raise ValueError("round must be >= 0")
        if self.parts < 0 or not (0 <= self.part < max(1, self.parts)):
            raise ValueError(f"part {self.part} of {self.parts}: need 0 <= part < parts")
        if self.parts and self.kind == "meta":
            raise ValueError("metadata is never cut into parts")

    @property
    def whole(self) -> ObjectKey:
        """The whole object this is a part of (itself when whole)."""
        return ObjectKey(self.job, self.round, self.kind, self.client) if self.parts else self

    def with_part(self, part: int, parts: int) -> ObjectKey:
        """Part ``part`` of ``parts`` of this (whole) model."""
        return ObjectKey(self.job, self.round, self.kind, self.client, part, parts)

    @property
    def field(self) -> str:
        """Field name inside the job's location hash: ``"<round>/<client|global|meta>"``,
        with ``~<part>.<parts>`` for a part."""
        name = f"{self.round}/{self.client if self.kind == 'update' else self.kind}"
        return f"{name}~{self.part}.{self.parts}" if self.parts else name

    @property
    def id(self) -> str:
        """Globally unique string id: ``"<job>/<round>/<client|global|meta>[~<s>.<S>]"``."""
        return f"{self.job}/{self.field}"

    @classmethod
    def parse(cls, ident: str) -> ObjectKey:
        """Inverse of :attr:`id`."""
        job, rnd, last = ident.rsplit("/", 2)
        part = parts = 0
        if "~" in last:
            last, _, cut = last.partition("~")
            s, _, n = cut.partition(".")
            if not (s.isdigit() and n.isdigit()):
                raise ValueError(f"bad part suffix in object id {ident!r}")
            part, parts = int(s), int(n)
            if parts == 0:
                raise ValueError(f"bad part suffix in object id {ident!r}")
        if last in ("global", "meta"):
            return cls(job, int(rnd), last, "", part, parts)
        return cls(job, int(rnd), "update", last, part, parts)

    def to_json(self) -> dict[str, object]:
        return {"job": self.job, "round": self.round, "kind": self.kind, "client": self.client}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ObjectKey:
        return cls(
            str(d["job"]),
            int(d["round"]),  # type: ignore[call-overload]
            str(d.get("kind", "update")),
            str(d.get("client") or ""),
        )


def update(job: str, client: str, rnd: int) -> ObjectKey:
    """Key of ``client``'s update in round ``rnd``."""
    return ObjectKey(job, rnd, "update", client)


def global_model(job: str, rnd: int) -> ObjectKey:
    """Key of the global model produced by round ``rnd``."""
    return ObjectKey(job, rnd, "global")


def meta(job: str, rnd: int) -> ObjectKey:
    """Key of round ``rnd``'s metadata."""
    return ObjectKey(job, rnd, "meta")
