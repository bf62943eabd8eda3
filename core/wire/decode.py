"""Decoding safetensors bodies into store objects: :class:`UpdateDecoder` streams a body straight
into the destination object; :func:`decode_into` does it for a whole body at once.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.wire.errors import (
    HeaderTooLarge,
    MalformedHeader,
    NonFinite,
    SizeMismatch,
    SpecMismatch,
    Truncated,
)
from core.wire.layout import (
    DEFAULT_MAX_HEADER,
    DTYPES,
    HEADER_SIZE,
    MASKED_DTYPE,
    SCRATCH_BYTES,
    ModelSpec,
    flat_view,
    parse_json_header,
)


@dataclass(frozen=True, slots=True)
class _Segment:
    begin: int  # offset in the safetensors data buffer
    end: int
    dst: int  # byte offset in the store object
    dtype: str


#: wire dtypes received straight into the store object (their store form is their wire form)
_RAW = frozenset({"F32", MASKED_DTYPE})


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
    ``b = get_buffer()``, then call ``buffer_updated(n)``; repeat until ``done``. For F32 and
    U32 (masked) tensors ``get_buffer`` returns the destination memory itself (zero copy); other
    dtypes pass through a scratch buffer and are cast to float32 on the fly. Errors raise :class:`WireError` subclasses.

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
        if seg.dtype in _RAW:
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
        entries = parse_json_header(bytes(self._head))
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
        if seg.dtype in _RAW:
            self._spos += n
            if self.check_finite and seg.dtype == "F32":
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
    element-wise check run. A masked model (``spec.masked``) holds no floats and passes.
    """
    if spec.masked:
        return  # uint32 masked vectors: no floats
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
