"""Object keys of the FLStore cache: what a cache function can hold.

Three kinds of object exist per job and round: a client's update ``(job, client, round)``, the
round's global model ``(job, round, "global")`` and the round's metadata ``(job, round, "meta")``
(hyperparameters, selected clients, sample counts, losses, durations).
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
    """

    job: str
    round: int
    kind: str = "update"
    client: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "update") != bool(self.client):
            raise ValueError("updates need a client id; global and meta objects have none")
        if self.round < 0:
            raise ValueError("round must be >= 0")

    @property
    def field(self) -> str:
        """Field name inside the job's location hash: ``"<round>/<client|global|meta>"``."""
        return f"{self.round}/{self.client if self.kind == 'update' else self.kind}"

    @property
    def id(self) -> str:
        """Globally unique string id: ``"<job>/<round>/<client|global|meta>"``."""
        return f"{self.job}/{self.field}"

    @classmethod
    def parse(cls, ident: str) -> ObjectKey:
        """Inverse of :attr:`id`."""
        job, rnd, last = ident.rsplit("/", 2)
        if last in ("global", "meta"):
            return cls(job, int(rnd), last)
        return cls(job, int(rnd), "update", last)

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
