"""What the stages exchange, as JSON-ready mappings of base64 strings, and their checks.

Stage 1 (advertise): ``{"c_pk", "s_pk", "b_commit"}`` per client. Stage 2 (share keys):
sender -> ``{receiver: envelope}``, routed so that each receiver gets ``{sender: envelope}``.
Stage 3 is the masked uint32 vector itself (an upload). Stage 4 (unmask): ``{"s": {owner:
[index, share]}, "b": {owner: [index, share]}}``: key-seed shares of dropped clients, self-seed
shares of survivors.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import KEY_BYTES, SEED_BYTES

CONTEXT_VERSION = b"fedfaas-secagg-v1"


class MessageError(ValueError):
    """A stage message that is malformed; the message says what is wrong."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str, size: int | None = None, *, limit: int = 4096) -> bytes:
    """Decode base64 ``text`` (at most ``limit`` characters), of exactly ``size`` bytes."""
    if not isinstance(text, str) or len(text) > limit:
        raise MessageError(f"{what} must be a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError(f"{what} is not valid base64") from None
    if size is not None and len(data) != size:
        raise MessageError(f"{what} must be {size} bytes, not {len(data)}")
    return data


def context(job: str, round_: int) -> bytes:
    """The public context of one round (binds keys, envelopes and the graph to it)."""
    return b"%s/%s/%d" % (CONTEXT_VERSION, job.encode(), round_)


@dataclass(frozen=True)
class Advert:
    """A client's stage-1 message: its envelope key, its mask key and its self-seed commitment."""

    c_pk: bytes
    s_pk: bytes
    b_commit: bytes

    def to_json(self) -> dict[str, str]:
        return {"c_pk": b64(self.c_pk), "s_pk": b64(self.s_pk), "b_commit": b64(self.b_commit)}

    @classmethod
    def from_json(cls, body: Any) -> Advert:
        if not isinstance(body, Mapping) or set(body) != {"c_pk", "s_pk", "b_commit"}:
            raise MessageError("an advert is an object with c_pk, s_pk and b_commit")
        return cls(
            unb64(body["c_pk"], "c_pk", KEY_BYTES),
            unb64(body["s_pk"], "s_pk", KEY_BYTES),
            unb64(body["b_commit"], "b_commit", 32),
        )


def envelopes_from_json(body: Any, limit: int) -> dict[str, bytes]:
    """``{peer: envelope}`` (base64) for at most ``limit`` peers."""
    if not isinstance(body, Mapping) or len(body) > limit:
        raise MessageError(f"envelopes are an object of at most {limit} peers")
    return {str(peer): unb64(env, f"envelope for {peer}", limit=512) for peer, env in body.items()}


Shares = dict[str, tuple[int, bytes]]


def unmask_from_json(body: Any, limit: int) -> tuple[Shares, Shares]:
    """The ``s`` and ``b`` shares (owner -> (index, share)) of a stage-4 message."""
    if not isinstance(body, Mapping) or set(body) != {"s", "b"}:
        raise MessageError("an unmask message is an object with s and b")
    out: list[Shares] = []
    for kind in ("s", "b"):
        part = body[kind]
        if not isinstance(part, Mapping) or len(part) > limit:
            raise MessageError(f"{kind} must be an object of at most {limit} owners")
        shares: Shares = {}
        for owner, item in part.items():
            if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int):
                raise MessageError(f"{kind}[{owner}] must be [index, share]")
            if not 1 <= item[0] <= limit:
                raise MessageError(f"{kind}[{owner}]: index out of range")
            shares[str(owner)] = (item[0], unb64(item[1], f"{kind}[{owner}]", SEED_BYTES))
        out.append(shares)
    return out[0], out[1]


def unmask_to_json(s: Shares, b: Shares) -> dict[str, dict[str, list[Any]]]:
    return {
        kind: {owner: [i, b64(share)] for owner, (i, share) in part.items()}
        for kind, part in (("s", s), ("b", b))
    }
