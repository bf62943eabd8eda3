"""The model wire format: safetensors on the wire, one flat float32 layout in the store.

A job's :class:`ModelSpec` (tensor names, shapes, wire dtypes, in one canonical order: sorted by
name) is fixed from its initial weights. Every store object of the job has the same layout::

    [ 64-byte header | tensor 0 (float32) | tensor 1 (float32) | ... | zero pad to 64 bytes ]

with the tensors back to back from the 64-byte-aligned data offset, so aggregation is one flat
vector operation over the data region (the final padding stays zero under any weighted sum), and
the first ``numel`` floats of the data region are the model's flat vector in sorted-name order:
what FLStore's cache functions hold, so they can map an update in place (``gateway/handoff``).
Whatever the wire dtype (F16, BF16, F64, integers), the store holds float32; :func:`encode`
casts back to the wire dtypes for ``GET model``.

Updates are decoded by :class:`UpdateDecoder`, a streaming state machine that hands out the
exact destination memory for each span of the body (``get_buffer`` / ``buffer_updated``, the
shape of :class:`asyncio.BufferedProtocol`), so an F32 body is received straight into the
store object with no intermediate copy. Everything here is pure: no I/O, no pickle.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from core.parallel import run_all

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
}


class WireError(ValueError):
    """Base of every wire-format error; ``code`` is the stable error code of the HTTP API."""

    code = "bad_update"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class MalformedHeader(WireError):
    """The safetensors header is not valid JSON of the expected shape."""

    code = "malformed_safetensors"


class HeaderTooLarge(WireError):
    """The safetensors header is larger than the configured bound."""

    code = "header_too_large"


class SpecMismatch(WireError):
    """The tensors do not match the job's model spec (names, shapes or dtypes)."""

    code = "spec_mismatch"


class SizeMismatch(WireError):
    """The body length disagrees with the header or the Content-Length."""

    code = "size_mismatch"


class Truncated(WireError):
    """The body ended before all tensor bytes arrived."""

    code = "truncated_body"


class NonFinite(WireError):
    """The update holds NaN or Inf."""

    code = "non_finite"


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
    """Each tensor of an object as a shaped float32 numpy view (no copy)."""
    return {
        t.name: np.frombuffer(buf, dtype=np.float32, count=t.numel, offset=t.offset).reshape(
            t.shape
        )
        for t in spec.tensors
    }


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
    entries = _parse_json(bytes(data[8 : 8 + n]))
    return entries, 8 + n


def _parse_json(raw: bytes) -> dict[str, dict[str, Any]]:
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


@dataclass(frozen=True, slots=True)
class _Segment:
    begin: int  # offset in the safetensors data buffer
    end: int
    dst: int  # byte offset in the store object
    dtype: str


def plan_segments(entries: dict[str, dict[str, Any]], spec: ModelSpec) -> list[_Segment]:
    """Check parsed header entries against ``spec``; return the body spans in body order."""
    want = spec.by_name()
    if set(entries) != set(want):
        missing = sorted(set(want) - set(entries))[:5]
        extra = sorted(set(entries) - set(want))[:5]
        raise SpecMismatch(
            f"tensor names differ from the job's spec: missing {missing}, unexpected {extra}"
        )
    segs = []
    for name, e in entries.items():
        t = want[name]
        if e["dtype"] != t.dtype:
            raise SpecMismatch(
                f"tensor {name!r}: dtype {e['dtype']}, the job's spec says {t.dtype}"
            )
        if tuple(e["shape"]) != t.shape:
            raise SpecMismatch(
                f"tensor {name!r}: shape {e['shape']}, the job's spec says {list(t.shape)}"
            )
        segs.append(_Segment(e["data_offsets"][0], e["data_offsets"][1], t.offset, t.dtype))
    segs.sort(key=lambda s: (s.begin, s.end))
    pos = 0
    for s in segs:
        if s.begin != pos:
            raise MalformedHeader(
                f"tensor data has a hole or overlap at byte {pos} of the data buffer"
            )
        pos = s.end
    return segs


def _convert_into(raw: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Cast raw wire elements to float32 into ``out``."""
    if dtype == "BF16":
        np.left_shift(raw.astype(np.uint32), 16, out=out.view(np.uint32))
    else:
        np.copyto(out, raw, casting="unsafe")


class UpdateDecoder:
    """Streams a safetensors body into a store object at the spec's offsets.

    Use like :class:`asyncio.BufferedProtocol`: write up to ``len(b)`` bytes of the body into
    ``b = get_buffer()``, then call ``buffer_updated(n)``; repeat until ``done``. For F32 tensors
    ``get_buffer`` returns the destination memory itself (zero copy); other dtypes pass through a
    scratch buffer and are cast on the fly. Errors raise :class:`WireError` subclasses.

    Parameters
    ----------
    spec : ModelSpec
        The job's spec.
    dst : memoryview
        Writable store object of ``spec.object_nbytes`` bytes.
    content_length : int
        Announced body length; the header must agree with it exactly.
    max_header : int
        Bound on the safetensors JSON header size.
    """

    def __init__(
        self,
        spec: ModelSpec,
        dst: memoryview,
        content_length: int,
        max_header: int = DEFAULT_MAX_HEADER,
        *,
        check_finite: bool = False,
    ) -> None:
        if len(dst) < spec.object_nbytes:
            raise ValueError("destination smaller than the spec's object size")
        self.spec = spec
        self.content_length = content_length
        self.max_header = max_header
        self.received = 0
        self._dst = dst
        self._head = bytearray(8)
        self._head_fill = 0
        self._phase = 0  # 0: length, 1: json, 2: body, 3: done
        self._segs: list[_Segment] = []
        self._si = 0
        self._spos = 0
        self._scratch: bytearray | None = None
        self._sfill = 0
        #: check NaN/Inf on each received span while it is still in cache (not in a second pass)
        self.check_finite = check_finite
        self._checked = 0  # bytes of the current segment already checked

    @property
    def done(self) -> bool:
        return self._phase == 3

    def get_buffer(self) -> memoryview:
        """Memory to receive the next bytes of the body into (never past ``content_length``)."""
        if self._phase < 2:
            return memoryview(self._head)[self._head_fill :]
        if self._phase == 3:
            raise SizeMismatch("body longer than its safetensors header describes")
        seg = self._segs[self._si]
        left = seg.end - seg.begin - self._spos
        if seg.dtype == "F32":
            start = seg.dst + self._spos
            return self._dst[start : start + left]
        if self._scratch is None:
            self._scratch = bytearray(SCRATCH_BYTES)
        return memoryview(self._scratch)[self._sfill : min(SCRATCH_BYTES, left)]

    def buffer_updated(self, n: int) -> None:
        """Account for ``n`` bytes just written into the last ``get_buffer``."""
        if n <= 0:
            return
        self.received += n
        if self.received > self.content_length:
            raise SizeMismatch("more body bytes than Content-Length")
        if self._phase == 0:
            self._head_fill += n
            if self._head_fill == 8:
                (hlen,) = struct.unpack("<Q", self._head)
                if hlen > self.max_header:
                    raise HeaderTooLarge(
                        f"safetensors header of {hlen} bytes exceeds the bound of {self.max_header}"
                    )
                if 8 + hlen > self.content_length:
                    raise SizeMismatch(
                        f"header of {hlen} bytes does not fit a body of {self.content_length}"
                    )
                self._head = bytearray(hlen)
                self._head_fill = 0
                self._phase = 1
                if hlen == 0:
                    self._start_body()
        elif self._phase == 1:
            self._head_fill += n
            if self._head_fill == len(self._head):
                self._start_body()
        else:
            self._body_updated(n)

    def _start_body(self) -> None:
        entries = _parse_json(bytes(self._head))
        self._segs = plan_segments(entries, self.spec)
        total = 8 + len(self._head) + (self._segs[-1].end if self._segs else 0)
        if total != self.content_length:
            raise SizeMismatch(
                f"safetensors header describes a body of {total} bytes, "
                f"Content-Length says {self.content_length}"
            )
        self._head = bytearray(0)
        self._zero_padding()
        self._phase = 2
        self._skip_empty()

    def _zero_padding(self) -> None:
        buf = self._dst
        ts = self.spec.tensors
        buf[:HEADER_SIZE] = bytes(HEADER_SIZE)
        for i, t in enumerate(ts):
            end = t.offset + t.numel * 4
            nxt = ts[i + 1].offset if i + 1 < len(ts) else self.spec.object_nbytes
            if nxt > end:
                buf[end:nxt] = bytes(nxt - end)

    def _skip_empty(self) -> None:
        while self._si < len(self._segs) and self._segs[self._si].end == self._segs[self._si].begin:
            self._si += 1
        if self._si == len(self._segs):
            self._phase = 3

    def _body_updated(self, n: int) -> None:
        seg = self._segs[self._si]
        if seg.dtype == "F32":
            self._spos += n
            if self.check_finite:
                upto = self._spos // 4 * 4
                if upto > self._checked:
                    _check_span(
                        np.frombuffer(
                            self._dst,
                            np.float32,
                            (upto - self._checked) // 4,
                            seg.dst + self._checked,
                        )
                    )
                    self._checked = upto
        else:
            assert self._scratch is not None
            self._sfill += n
            isz = DTYPES[seg.dtype].itemsize
            whole = self._sfill // isz * isz
            if whole:
                raw = np.frombuffer(self._scratch, dtype=DTYPES[seg.dtype], count=whole // isz)
                el0 = self._spos // isz
                out = np.frombuffer(
                    self._dst, dtype=np.float32, count=whole // isz, offset=seg.dst + el0 * 4
                )
                _convert_into(raw, seg.dtype, out)
                if self.check_finite and seg.dtype in ("F16", "BF16", "F64"):
                    _check_span(out)
                rest = self._sfill - whole
                self._scratch[:rest] = self._scratch[whole : self._sfill]
                self._sfill = rest
                self._spos += whole
        if self._spos == seg.end - seg.begin:
            self._si += 1
            self._spos = 0
            self._checked = 0
            self._skip_empty()

    def finish(self, *, check_finite: bool = True) -> None:
        """Raise unless the whole body arrived; optionally check every value is finite."""
        if self._phase != 3 or self.received != self.content_length:
            raise Truncated(f"body ended after {self.received} of {self.content_length} bytes")
        if check_finite and not self.check_finite:
            check_finite_values(self._dst, self.spec)


def _check_span(x: np.ndarray) -> None:
    """Raise :class:`NonFinite` if ``x`` (float32) holds NaN or Inf (see check_finite_values)."""
    with np.errstate(invalid="ignore", over="ignore"):  # huge finite values may overflow x.x
        if x.size == 0 or math.isfinite(float(np.dot(x, x))):
            return
    bad = int(np.count_nonzero(~np.isfinite(x)))
    if bad:
        raise NonFinite(f"update holds {bad} NaN or Inf values")


def check_finite_values(buf: memoryview | bytearray, spec: ModelSpec) -> None:
    """Raise :class:`NonFinite` if the data region holds NaN or Inf.

    Fast path: one BLAS dot product ``x . x`` is finite whenever every value is finite and
    not huge; only if it is not (NaN, Inf, or an overflow of huge finite values) is the exact
    element-wise check run.
    """
    flat = flat_view(buf, spec)
    with np.errstate(invalid="ignore", over="ignore"):
        if math.isfinite(float(np.dot(flat, flat))):
            return
    bad = 0
    step = 1 << 20
    for i in range(0, flat.size, step):
        bad += int(flat.size and np.count_nonzero(~np.isfinite(flat[i : i + step])))
    if bad:
        raise NonFinite(f"update holds {bad} NaN or Inf values")


def decode_into(
    data: bytes | bytearray | memoryview,
    spec: ModelSpec,
    dst: memoryview,
    max_header: int = DEFAULT_MAX_HEADER,
    check_finite: bool = True,
) -> None:
    """Decode a complete safetensors buffer into ``dst`` (convenience over the decoder)."""
    dec = UpdateDecoder(spec, dst, len(data), max_header)
    src = memoryview(data)
    pos = 0
    while not dec.done and pos < len(src):
        b = dec.get_buffer()
        n = min(len(b), len(src) - pos)
        b[:n] = src[pos : pos + n]
        pos += n
        dec.buffer_updated(n)
    dec.finish(check_finite=check_finite)


def encode(
    buf: memoryview | bytearray | bytes, spec: ModelSpec, metadata: Mapping[str, str] | None = None
) -> bytes:
    """Encode a store object's tensors as a safetensors file in the spec's wire dtypes."""
    return bytes(encode_view(buf, spec, metadata))


def encode_view(
    buf: memoryview | bytearray | bytes,
    spec: ModelSpec,
    metadata: Mapping[str, str] | None = None,
    *,
    threads: int = 1,
    out: np.ndarray | None = None,
) -> memoryview:
    """:func:`encode` into a buffer, returned as a read-only ``memoryview`` (no final copy
    into ``bytes``): every byte written once, the data split by element range over ``threads``
    threads (numpy's copies and casts release the GIL, so they run on as many cores). ``out``:
    a uint8 array to write into when it is large enough (one written before has its pages in
    place: no page faults), else a new one."""
    raw = _safetensors_header(spec, metadata)
    base, pos = 8 + len(raw), spec.wire_data_nbytes
    if out is None or out.dtype != np.uint8 or out.size < base + pos:
        out = np.empty(base + pos, np.uint8)  # not zeroed: every byte is written below
    out = out[: base + pos]
    struct.pack_into("<Q", out.data, 0, len(raw))
    out[8:base] = np.frombuffer(raw, np.uint8)
    src = memoryview(buf)
    run_all(
        [partial(_encode_part, src, out, base, part) for part in _element_ranges(spec, threads)]
    )
    return out.data.toreadonly()


def _safetensors_header(spec: ModelSpec, metadata: Mapping[str, str] | None) -> bytes:
    """The JSON header of :func:`encode`'s output, padded to 8 bytes."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for t in spec.tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [pos, pos + t.wire_nbytes],
        }
        pos += t.wire_nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def encoded_nbytes(spec: ModelSpec, metadata: Mapping[str, str] | None = None) -> int:
    """Size of :func:`encode`'s output for ``spec`` and ``metadata``."""
    return 8 + len(_safetensors_header(spec, metadata)) + spec.wire_data_nbytes


def _element_ranges(spec: ModelSpec, n: int) -> list[list[tuple[TensorSpec, int, int, int]]]:
    """``n`` lists of ``(tensor, first element, end element, wire offset of the tensor)``
    covering every element once, in nearly equal shares of bytes written."""
    total = spec.wire_data_nbytes
    n = max(1, n)
    share = -(-total // n) if total else 1
    parts: list[list[tuple[TensorSpec, int, int, int]]] = [[] for _ in range(n)]
    wire_pos = done = 0
    for t in spec.tensors:
        size = DTYPES[t.dtype].itemsize
        lo = 0
        while lo < t.numel:
            k = min(done // share, n - 1)
            room = max(1, ((k + 1) * share - done) // size) if k < n - 1 else t.numel - lo
            hi = min(t.numel, lo + room)
            parts[k].append((t, lo, hi, wire_pos))
            done += (hi - lo) * size
            lo = hi
        wire_pos += t.wire_nbytes
    return [p for p in parts if p]


def _encode_part(
    src: memoryview, out: np.ndarray, base: int, part: list[tuple[TensorSpec, int, int, int]]
) -> None:
    for t, lo, hi, wire_pos in part:
        dt = DTYPES[t.dtype]
        s = np.frombuffer(src, dtype=np.float32, count=hi - lo, offset=t.offset + 4 * lo)
        start = base + wire_pos + dt.itemsize * lo
        d = out[start : start + dt.itemsize * (hi - lo)].view(dt)
        if t.dtype == "F32":
            d[...] = s
        elif t.dtype == "BF16":
            u = s.view(np.uint32)
            d[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        elif t.dtype.startswith("F"):
            d[...] = s.astype(d.dtype)
        else:
            info = np.iinfo(d.dtype)
            d[...] = np.clip(np.rint(s), info.min, info.max).astype(d.dtype)


def encode_tensors(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    """Encode named numpy arrays as safetensors (F32/F16/F64/int dtypes; for tests and clients)."""
    rev = {v: k for k, v in DTYPES.items() if k != "BF16"}
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    pos = 0
    arrays = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dt = rev[a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(a.tobytes() for a in arrays)


def decode_tensors(
    data: bytes | bytearray | memoryview, max_header: int = DEFAULT_MAX_HEADER
) -> dict[str, np.ndarray]:
    """Decode safetensors into float32 numpy arrays (copies; for tests, clients and job creation)."""
    spec = ModelSpec.from_safetensors(data, max_header)
    buf = bytearray(spec.object_nbytes)
    decode_into(data, spec, memoryview(buf), max_header, check_finite=False)
    return {k: v.copy() for k, v in tensor_views(buf, spec).items()}
