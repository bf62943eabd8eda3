"""A state dict of numpy arrays as a safetensors body written while it is sent.

:class:`SafetensorsBody` is the bytes ``safetensors.numpy.save`` returns for the same arrays
(the same header, the same tensor order, byte for byte), produced chunk by chunk from the
arrays' own memory: the header first (computed from the names, dtypes and shapes alone), then
each tensor's bytes. Its length is known before a byte is made, so an upload sends an exact
``Content-Length`` and its first byte at once, instead of building the whole body in memory
first (a copy of the model, and the time to make it, before the upload starts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import numpy as np

#: bytes per chunk the body yields
CHUNK = 1 << 20

#: numpy dtype -> safetensors dtype name, in safetensors' own dtype order (its ``Dtype``
#: enum): ``save`` lays tensors out by that order, the latest first, then by name
_DTYPES = (
    ("bool", "BOOL"),
    ("uint8", "U8"),
    ("int8", "I8"),
    ("int16", "I16"),
    ("uint16", "U16"),
    ("float16", "F16"),
    ("int32", "I32"),
    ("uint32", "U32"),
    ("float32", "F32"),
    ("float64", "F64"),
    ("int64", "I64"),
    ("uint64", "U64"),
)
_NAME = {np.dtype(n).name: st for n, st in _DTYPES}
_RANK = {np.dtype(n).name: i for i, (n, _) in enumerate(_DTYPES)}


def streamable(tensors: Mapping[str, object]) -> bool:
    """Whether :class:`SafetensorsBody` can send ``tensors``: numpy arrays of the dtypes
    safetensors has (anything else takes ``safetensors.numpy.save``'s path and its errors)."""
    return all(
        isinstance(v, np.ndarray) and v.dtype.newbyteorder("=").name in _NAME
        for v in tensors.values()
    )


class SafetensorsBody:
    """``safetensors.numpy.save(tensors)``'s bytes, made as they are read (see the module).

    Iterating it yields the body in chunks of at most :data:`CHUNK` bytes; it can be iterated
    again (an upload sent once more). ``nbytes``: the body's length. The arrays are read as
    they are when iterated: one changed meanwhile is sent as it is then. A tensor that is not
    C-contiguous or little-endian is copied (that tensor alone) when its turn comes.
    """

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        if not streamable(tensors):
            raise TypeError("a streamed safetensors body takes numpy arrays of safetensors dtypes")
        key = {k: np.dtype(v.dtype.newbyteorder("=")).name for k, v in tensors.items()}
        self._order = sorted(tensors, key=lambda k: (-_RANK[key[k]], k))
        self._tensors = dict(tensors)
        header: dict[str, object] = {}
        offset = 0
        for k in self._order:
            v = tensors[k]
            header[k] = {
                "dtype": _NAME[key[k]],
                "shape": list(v.shape),
                "data_offsets": [offset, offset + v.nbytes],
            }
            offset += v.nbytes
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        raw += b" " * (-len(raw) % 8)
        self._head = len(raw).to_bytes(8, "little") + raw
        self.nbytes = len(self._head) + offset

    def __len__(self) -> int:
        return self.nbytes

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        for k in self._order:
            view = _bytes_of(self._tensors[k])
            for start in range(0, len(view), CHUNK):
                yield bytes(view[start : start + CHUNK])


def _bytes_of(arr: np.ndarray) -> memoryview:
    """The tensor's bytes as safetensors lays them (C order, little-endian), in place when
    they already are."""
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return memoryview(flat.data) if flat.size else memoryview(b"")
