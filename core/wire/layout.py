"""The store object's layout: the 64-byte header, a job's :class:`ModelSpec` and views of the data."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.wire.errors import (
    HeaderTooLarge,
    MalformedHeader,
    SpecMismatch,
    Truncated,
)

ALIGN = 64
HEADER_SIZE = 64
MAGIC = b"FFW1"
FORMAT_VERSION = 2  # 1 padded each tensor to 64 bytes
DEFAULT_MAX_HEADER = 1 << 20
SCRATCH_BYTES = 1 << 20

# Header: magic, version, kind, spec hash, weight, count, round, data offset, data bytes, reserved
_HEADER = struct.Struct("<4sHH16sdIIQQQ")
assert _HEADER.size == HEADER_SIZE

KIND_EMPTY = 0
KIND_UPDATE = 1
KIND_PARTIAL = 2
KIND_GLOBAL = 3

#: safetensors dtype -> (numpy dtype of the raw bytes, item size). BF16 is raw uint16.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U32": np.dtype("<u4"),
}

#: the dtype of secure aggregation's masked vectors (:mod:`core.secagg`): stored as the raw
#: uint32 it is, never converted, and summed in Z_2^32 by the aggregators
MASKED_DTYPE = "U32"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of a model: name, wire dtype, shape and its offset in a store object."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def wire_nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class ModelSpec:
    """Names, shapes and dtypes of a job's model in canonical (sorted-name) order.

    Attributes
    ----------
    tensors : tuple of TensorSpec
        With ``offset`` = byte offset of the float32 tensor inside a store object.
    object_nbytes : int
        Size of every store object of the job (header + data region).
    hash : bytes
        16-byte digest of the canonical (name, dtype, shape) list, written in object headers.
    """

    tensors: tuple[TensorSpec, ...]
    object_nbytes: int
    hash: bytes

    @classmethod
    def build(cls, items: list[tuple[str, str, tuple[int, ...]]]) -> ModelSpec:
        """Lay out ``(name, dtype, shape)`` items (any order) in canonical order."""
        if not items:
            raise SpecMismatch("a model needs at least one tensor")
        out: list[TensorSpec] = []
        off = HEADER_SIZE
        for name, dtype, shape in sorted(items):
            if dtype not in DTYPES:
                raise SpecMismatch(
                    f"tensor {name!r}: dtype {dtype} not supported ({sorted(DTYPES)})"
                )
            spec = TensorSpec(name, dtype, tuple(int(d) for d in shape), off)
            off += spec.numel * 4
            out.append(spec)
        if len({t.dtype == MASKED_DTYPE for t in out}) > 1:
            raise SpecMismatch(
                f"a model of masked vectors ({MASKED_DTYPE}) has no tensors of other dtypes"
            )
        canon = json.dumps([[t.name, t.dtype, list(t.shape)] for t in out], separators=(",", ":"))
        digest = hashlib.sha256(canon.encode()).digest()[:16]
        return cls(tuple(out), _align(off), digest)

    @classmethod
    def from_safetensors(
        cls, data: bytes | bytearray | memoryview, max_header: int = DEFAULT_MAX_HEADER
    ) -> ModelSpec:
        """The spec of a safetensors file (the job's initial weights)."""
        header, _ = parse_raw_header(data, max_header)
        return cls.build([(n, e["dtype"], tuple(e["shape"])) for n, e in header.items()])

    @property
    def data_nbytes(self) -> int:
        return self.object_nbytes - HEADER_SIZE

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def masked(self) -> bool:
        """True for a model of masked vectors (every tensor ``U32``): its objects hold uint32,
        are folded in Z_2^32 and never divided, and hold no floats to check."""
        return self.tensors[0].dtype == MASKED_DTYPE

    @property
    def wire_data_nbytes(self) -> int:
        return sum(t.wire_nbytes for t in self.tensors)

    def max_upload_bytes(self, max_header: int = DEFAULT_MAX_HEADER) -> int:
        """Largest body a valid upload of this spec can have."""
        return 8 + max_header + self.wire_data_nbytes

    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    def to_json(self) -> dict[str, object]:
        """Plain-data form (also what the HTTP API returns as ``spec``)."""
        return {
            "hash": self.hash.hex(),
            "object_nbytes": self.object_nbytes,
            "numel": self.numel,
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in self.tensors
            ],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> ModelSpec:
        tensors = obj["tensors"]
        assert isinstance(tensors, list)
        spec = cls.build([(t["name"], t["dtype"], tuple(t["shape"])) for t in tensors])
        if "hash" in obj and obj["hash"] != spec.hash.hex():
            raise SpecMismatch("spec hash does not match its tensors")
        return spec


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """The 64-byte header of a store object."""

    kind: int
    spec_hash: bytes
    weight: float
    count: int
    round: int
    data_nbytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_header(
    buf: memoryview | bytearray,
    spec: ModelSpec,
    *,
    kind: int,
    weight: float,
    count: int,
    round: int,
) -> None:
    """Write the object header into the first 64 bytes of ``buf``."""
    write_object_header(
        buf,
        kind=kind,
        spec_hash=spec.hash,
        data_nbytes=spec.data_nbytes,
        weight=weight,
        count=count,
        round=round,
    )


def write_object_header(
    buf: memoryview | bytearray,
    *,
    kind: int,
    spec_hash: bytes,
    data_nbytes: int,
    weight: float,
    count: int,
    round: int,
) -> None:
    """Write an object header given the spec hash and data size (aggregators know no spec)."""
    _HEADER.pack_into(
        buf,
        0,
        MAGIC,
        FORMAT_VERSION,
        kind,
        spec_hash,
        float(weight),
        count,
        round,
        HEADER_SIZE,
        data_nbytes,
        0,
    )


def read_header(buf: memoryview | bytes | bytearray) -> ObjectHeader:
    """Read and check the header of a store object."""
    magic, version, kind, digest, weight, count, rnd, data_off, data_n, _ = _HEADER.unpack_from(
        buf, 0
    )
    if magic != MAGIC or version != FORMAT_VERSION or data_off != HEADER_SIZE:
        raise MalformedHeader(f"not a store object (magic {magic!r}, version {version})")
    return ObjectHeader(kind, digest, weight, count, rnd, data_n)


def flat_view(buf: memoryview | bytearray, spec: ModelSpec) -> np.ndarray:
    """The data region of an object as one float32 vector (no copy; the final padding included,
    zero)."""
    return np.frombuffer(buf, dtype=np.float32, count=spec.data_nbytes // 4, offset=HEADER_SIZE)


def tensor_views(buf: memoryview | bytearray, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Each tensor of an object as a shaped numpy view (no copy): float32, or uint32 for a
    masked model's ``U32`` tensors."""
    return {
        t.name: np.frombuffer(
            buf, dtype=store_dtype(t.dtype), count=t.numel, offset=t.offset
        ).reshape(t.shape)
        for t in spec.tensors
    }


def store_dtype(dtype: str) -> np.dtype:
    """The dtype a tensor of wire dtype ``dtype`` has in the store: float32, or uint32 for
    ``U32`` (masked vectors are copied, never converted)."""
    return DTYPES[dtype] if dtype == MASKED_DTYPE else np.dtype(np.float32)


def parse_raw_header(
    data: bytes | bytearray | memoryview, max_header: int
) -> tuple[dict[str, dict[str, Any]], int]:
    """Parse the safetensors header of a complete buffer: ``(tensor entries, data start)``."""
    if len(data) < 8:
        raise MalformedHeader("safetensors body shorter than its 8-byte header length")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > max_header:
        raise HeaderTooLarge(f"safetensors header of {n} bytes exceeds the bound of {max_header}")
    if 8 + n > len(data):
        raise Truncated(f"safetensors header of {n} bytes but only {len(data) - 8} follow")
    entries = parse_json_header(bytes(data[8 : 8 + n]))
    return entries, 8 + n


def parse_json_header(raw: bytes) -> dict[str, dict[str, Any]]:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedHeader(f"safetensors header is not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedHeader("safetensors header must be a JSON object")
    meta = obj.pop("__metadata__", None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        raise MalformedHeader("__metadata__ must map strings to strings")
    for name, e in obj.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise MalformedHeader(
                f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets"
            )
        shape, offs = e["shape"], e["data_offsets"]
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise MalformedHeader(f"tensor {name!r}: shape must be a list of non-negative integers")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            and 0 <= offs[0] <= offs[1]
        ):
            raise MalformedHeader(
                f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end"
            )
        if not isinstance(e["dtype"], str):
            raise MalformedHeader(f"tensor {name!r}: dtype must be a string")
        if e["dtype"] not in DTYPES:
            raise SpecMismatch(f"tensor {name!r}: dtype {e['dtype']} not supported")
        if offs[1] - offs[0] != math.prod(shape) * DTYPES[e["dtype"]].itemsize:
            raise MalformedHeader(
                f"tensor {name!r}: data_offsets span {offs[1] - offs[0]} bytes, "
                f"shape {shape} of {e['dtype']} needs {math.prod(shape) * DTYPES[e['dtype']].itemsize}"
            )
    return obj
