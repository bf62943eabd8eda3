"""The model wire format: safetensors on the wire, one flat float32 layout in the store.

A job's :class:`ModelSpec` (tensor names, shapes, wire dtypes, in one canonical order: sorted by
name) is fixed from its initial weights. Every store object of the job has the same layout::

    [ 64-byte header | tensor 0 (float32) | tensor 1 (float32) | ... | zero pad to 64 bytes ]

with the tensors back to back from the 64-byte-aligned data offset, so aggregation is one flat
vector operation over the data region (the final padding stays zero under any weighted sum), and
the first ``numel`` floats of the data region are the model's flat vector in sorted-name order:
what FLStore's cache functions hold, so they can map an update in place (``gateway/handoff``).
Whatever the wire dtype (F16, BF16, F64, integers), the store holds float32; :func:`encode`
casts back to the wire dtypes for ``GET model``. The one exception is ``U32``, the dtype of
secure aggregation's masked vectors (:mod:`core.secagg`): copied as the raw uint32 it is, never
converted, in a model of ``U32`` tensors only (:attr:`ModelSpec.masked`).

Updates are decoded by :class:`UpdateDecoder`, a streaming state machine that hands out the
exact destination memory for each span of the body (``get_buffer`` / ``buffer_updated``, the
shape of :class:`asyncio.BufferedProtocol`), so an F32 body is received straight into the
store object with no intermediate copy. Everything here is pure: no I/O, no pickle.
"""

from __future__ import annotations

from core.wire.decode import (
    UpdateDecoder,
    check_finite_values,
    decode_into,
    plan_segments,
)
from core.wire.encode import (
    decode_tensors,
    encode,
    encode_tensors,
    encode_view,
    encoded_nbytes,
)
from core.wire.errors import (
    HeaderTooLarge,
    MalformedHeader,
    NonFinite,
    SizeMismatch,
    SpecMismatch,
    Truncated,
    WireError,
)
from core.wire.layout import (
    ALIGN,
    DEFAULT_MAX_HEADER,
    DTYPES,
    FORMAT_VERSION,
    HEADER_SIZE,
    KIND_EMPTY,
    KIND_GLOBAL,
    KIND_PARTIAL,
    KIND_UPDATE,
    MAGIC,
    MASKED_DTYPE,
    SCRATCH_BYTES,
    ModelSpec,
    ObjectHeader,
    TensorSpec,
    flat_view,
    parse_raw_header,
    read_header,
    store_dtype,
    tensor_views,
    write_header,
    write_object_header,
)

__all__ = [
    "ALIGN",
    "DEFAULT_MAX_HEADER",
    "DTYPES",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "HeaderTooLarge",
    "KIND_EMPTY",
    "KIND_GLOBAL",
    "KIND_PARTIAL",
    "KIND_UPDATE",
    "MAGIC",
    "MASKED_DTYPE",
    "MalformedHeader",
    "ModelSpec",
    "NonFinite",
    "ObjectHeader",
    "SCRATCH_BYTES",
    "SizeMismatch",
    "SpecMismatch",
    "TensorSpec",
    "Truncated",
    "UpdateDecoder",
    "WireError",
    "check_finite_values",
    "decode_into",
    "decode_tensors",
    "encode",
    "encode_tensors",
    "encode_view",
    "encoded_nbytes",
    "flat_view",
    "parse_raw_header",
    "plan_segments",
    "read_header",
    "store_dtype",
    "tensor_views",
    "write_header",
    "write_object_header",
]
