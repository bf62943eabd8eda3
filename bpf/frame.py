"""The sidecar frame: a fixed 64-byte, little-endian message that carries an object key.

Layout (offsets in bytes; the eBPF program reads ``dst`` at offset 0 and ``kind`` at 8):

====  =====  ===========================================================
off   type   field
====  =====  ===========================================================
0     u32    dst: destination endpoint id
4     u32    src: source endpoint id
8     u16    kind (:class:`Kind`)
10    u16    flags (TASK: role 1 leaf, 2 middle, 3 top; ``FLAG_LAZY`` 0x100, ``FLAG_MASKED`` 0x200)
12    u32    job: numeric job id
16    16B    key: object key in the node's shared-memory store
32    f64    weight: sample count (UPDATE) or weight sum (PARTIAL)
40    u32    round
44    u32    count: goal (TASK) or number of updates folded (PARTIAL)
48    u32    parent: parent endpoint id (TASK)
52    u32    seq
56    u64    t_ns: sender's CLOCK_MONOTONIC ns
====  =====  ===========================================================
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields

from bpf.errors import FrameError

FRAME_SIZE = 64
KEY_SIZE = 16
FLAG_LAZY = 0x100
#: TASK: the job's objects are secure aggregation's masked uint32 vectors (fold in Z_2^32)
FLAG_MASKED = 0x200
ROLE_MASK = 0xFF

_STRUCT = struct.Struct("<IIHHI16sdIIIIQ")
assert _STRUCT.size == FRAME_SIZE

_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_ZERO_KEY = bytes(KEY_SIZE)


class Kind(enum.IntEnum):
    """What a frame means to its receiver."""

    UPDATE = 1
    TASK = 2
    PARTIAL = 3
    ACK = 4
    RESULT = 5
    PING = 6
    SHUTDOWN = 7
    #: router -> endpoint on the registration socket only: the endpoint now serves ``job``
    #: (0: none); carries the job's store folder as an SCM_RIGHTS directory fd
    GRANT = 8
    #: endpoint -> gateway: a middle or top sealed its accumulator after folding a child's
    #: partial (``key``; ``weight`` and ``count`` so far; the child slot in ``parent``), so
    #: the inputs it covers can be freed once this is journaled (``gateway/rounds.py``)
    CHECKPOINT = 9
    #: gateway -> endpoint: a fresh object for the task's next accumulator (``seq`` = slot)
    SPARE = 10
    #: gateway -> endpoint: run shard ``seq`` of the pass a manifest object names (``key``;
    #: the pass in ``flags``, see ``core/shards.py``), for a rule that needs every update
    SHARD = 11
    #: endpoint -> gateway: shard ``seq`` of manifest ``key`` is written
    SHARD_DONE = 12
    #: endpoint -> gateway: a frame could not be acted on, for want of an object it named:
    #: ``key`` is that object, ``count`` why (:class:`Failure`), ``flags`` the failed frame's
    #: kind, ``seq`` the slot (or shard) it was for, ``round`` its round
    FAILED = 13


class Failure(enum.IntEnum):
    """Why an endpoint could not use an object (a FAILED frame's ``count``)."""

    #: no object with that key in the job's store
    MISSING = 1
    #: the object is there but cannot be read as one (truncated, no valid header)
    UNREADABLE = 2
    #: the object holds another model (its spec or size) than the task's
    OTHER_MODEL = 3

    def describe(self) -> str:
        """What happened to the object, as a sentence's end."""
        return {
            Failure.MISSING: "is not in the store",
            Failure.UNREADABLE: "cannot be read (truncated or corrupt)",
            Failure.OTHER_MODEL: "holds another model than the task's",
        }[self]


class Role(enum.IntEnum):
    """Aggregator role carried in the low byte of a TASK frame's ``flags``."""

    LEAF = 1
    MIDDLE = 2
    TOP = 3


@dataclass(frozen=True)
class Frame:
    """One sidecar message. Immutable; ``encode`` gives exactly :data:`FRAME_SIZE` bytes.

    Parameters
    ----------
    dst, src : int
        Destination and source endpoint ids (u32). ``src`` 0 means "fill in mine":
        :meth:`bpf.Endpoint.send` stamps its own id.
    kind : Kind
        Message kind.
    flags : int
        u16; for TASK the role (:class:`Role`) in the low byte, ``FLAG_LAZY`` for lazy mode.
    job : int
        Numeric job id (u32).
    key : bytes
        16-byte object key in the node's shared-memory store (zeros when unused).
    weight : float
        Sample count (UPDATE) or weight sum (PARTIAL).
    round, count, parent, seq : int
        u32 fields, see the module table.
    t_ns : int
        Sender's CLOCK_MONOTONIC time in ns (u64). 0 means "stamp at send".
    """

    dst: int
    src: int
    kind: Kind
    flags: int = 0
    job: int = 0
    key: bytes = _ZERO_KEY
    weight: float = 0.0
    round: int = 0
    count: int = 0
    parent: int = 0
    seq: int = 0
    t_ns: int = 0

    def __post_init__(self) -> None:
        kind = self.kind
        if kind.__class__ is not Kind:
            try:
                kind = _KINDS[kind]
            except (KeyError, TypeError):
                raise FrameError(f"unknown frame kind {kind!r}") from None
            object.__setattr__(self, "kind", kind)
        key = self.key
        if key.__class__ is not bytes or len(key) != KEY_SIZE:
            raise FrameError(f"key must be {KEY_SIZE} bytes, got {key!r:.60}")
        try:  # packing checks every integer's type and range in C, in about a microsecond
            self.encode()
        except struct.error:
            self._explain_range()
            raise

    def _explain_range(self) -> None:
        for name in ("dst", "src", "job", "round", "count", "parent", "seq"):
            _check_range(name, getattr(self, name), _U32)
        _check_range("flags", self.flags, _U16)
        _check_range("t_ns", self.t_ns, _U64)
        raise FrameError(f"weight must be a float, got {self.weight!r}")

    @property
    def role(self) -> Role | None:
        """The aggregator role of a TASK frame, or None when the low byte holds no role."""
        try:
            return Role(self.flags & ROLE_MASK)
        except ValueError:
            return None

    @property
    def lazy(self) -> bool:
        """True when the ``FLAG_LAZY`` bit is set."""
        return bool(self.flags & FLAG_LAZY)

    @property
    def masked(self) -> bool:
        """True when the ``FLAG_MASKED`` bit is set."""
        return bool(self.flags & FLAG_MASKED)

    def encode(self) -> bytes:
        """Pack into the 64-byte wire form."""
        return _STRUCT.pack(
            self.dst,
            self.src,
            self.kind,
            self.flags,
            self.job,
            self.key,
            self.weight,
            self.round,
            self.count,
            self.parent,
            self.seq,
            self.t_ns,
        )

    def encode_as(self, src: int, t_ns: int) -> bytes:
        """Pack with ``src`` and ``t_ns`` replaced (senders stamp their id and clock)."""
        return _STRUCT.pack(
            self.dst,
            src,
            self.kind,
            self.flags,
            self.job,
            self.key,
            self.weight,
            self.round,
            self.count,
            self.parent,
            self.seq,
            t_ns,
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> Frame:
        """Unpack a 64-byte frame.

        Raises
        ------
        FrameError
            If ``buf`` is not exactly 64 bytes or the kind is unknown.
        """
        if len(buf) != FRAME_SIZE:
            raise FrameError(f"a frame is {FRAME_SIZE} bytes, got {len(buf)}")
        values = _STRUCT.unpack(buf)
        kind = _KINDS.get(values[2])
        if kind is None:
            raise FrameError(f"unknown frame kind {values[2]!r}")
        # Unpacked integers are in range by construction: skip __init__ and __post_init__
        # (a frozen dataclass sets each field through object.__setattr__, ~10x slower).
        frame = object.__new__(cls)
        attrs = frame.__dict__
        attrs.update(zip(_FIELDS, values, strict=True))
        attrs["kind"] = kind
        return frame


def _check_range(name: str, value: int, top: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= top:
        raise FrameError(f"{name} must be an integer in [0, {top}], got {value!r}")


_KINDS: dict[int, Kind] = {int(k): k for k in Kind}
_FIELDS = tuple(f.name for f in fields(Frame))
