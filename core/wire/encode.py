"""Encoding store objects and named arrays as safetensors (:func:`encode`, :func:`encode_tensors`),
and back (:func:`decode_tensors`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from functools import partial

import numpy as np

from core.parallel import run_all
from core.wire.decode import decode_into
from core.wire.layout import (
    DEFAULT_MAX_HEADER,
    DTYPES,
    MASKED_DTYPE,
    ModelSpec,
    TensorSpec,
    tensor_views,
)


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
        elif t.dtype == MASKED_DTYPE:
            d[...] = s.view(np.uint32)  # stored as the raw uint32 it is
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
    """Decode safetensors into numpy arrays, float32 or a masked model's uint32 (copies; for
    tests, clients and job creation)."""
    spec = ModelSpec.from_safetensors(data, max_header)
    buf = bytearray(spec.object_nbytes)
    decode_into(data, spec, memoryview(buf), max_header, check_finite=False)
    return {k: v.copy() for k, v in tensor_views(buf, spec).items()}
