"""The wire format's ``U32`` dtype, secure aggregation's masked vectors: received straight into
the store object and kept as the raw uint32 they are (never converted to float32, never checked
for NaN), encoded back as they are, and only in models of ``U32`` tensors."""

from __future__ import annotations

import numpy as np
import pytest

from core import wire

D = 1000


def _masked(seed: int = 0) -> np.ndarray:
    """A uint32 vector whose bit patterns include float32 NaNs and infinities."""
    vec = np.random.default_rng(seed).integers(0, 2**32, D + 1, dtype=np.uint32)
    vec[:3] = [0x7FC00000, 0x7F800000, 0xFF800000]  # NaN, +Inf, -Inf as float32
    return vec


def test_a_masked_body_is_received_in_place_and_kept_as_uint32() -> None:
    vec = _masked()
    body = wire.encode_tensors({"masked": vec})
    spec = wire.ModelSpec.from_safetensors(body)
    assert spec.masked and spec.tensors[0].dtype == wire.MASKED_DTYPE
    dst = memoryview(bytearray(spec.object_nbytes))
    dec = wire.UpdateDecoder(spec, dst, len(body), check_finite=True)
    data_start = 8 + int.from_bytes(body[:8], "little")
    pos = 0
    while not dec.done:
        buf = dec.get_buffer()
        if pos >= data_start:  # the data: the destination object's own memory (zero copy)
            assert _offset_in(dst, buf) == spec.tensors[0].offset + pos - data_start
        n = min(len(buf), len(body) - pos, 777)  # uneven chunks, as a socket gives them
        buf[:n] = body[pos : pos + n]
        pos += n
        dec.buffer_updated(n)
    dec.finish(check_finite=True)  # bit patterns of NaN and Inf are no floats here
    got = wire.tensor_views(dst, spec)["masked"]
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, vec)


def _offset_in(dst: memoryview, buf: memoryview) -> int:
    """Where ``buf`` starts inside ``dst`` (-1 when it is other memory)."""
    if buf.obj is not dst.obj:
        return -1
    base = np.frombuffer(dst, np.uint8).__array_interface__["data"][0]
    return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0] - base)


def test_a_masked_object_encodes_back_to_the_same_vector() -> None:
    vec = _masked(1)
    body = wire.encode_tensors({"masked": vec})
    spec = wire.ModelSpec.from_safetensors(body)
    obj = bytearray(spec.object_nbytes)
    wire.decode_into(body, spec, memoryview(obj), check_finite=True)
    again = wire.encode(obj, spec)
    assert again == body
    got = wire.decode_tensors(again)["masked"]
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, vec)


def test_float_models_still_refuse_nan() -> None:
    body = wire.encode_tensors({"w": np.array([1.0, np.nan], np.float32)})
    spec = wire.ModelSpec.from_safetensors(body)
    assert not spec.masked
    with pytest.raises(wire.NonFinite):
        wire.decode_into(body, spec, memoryview(bytearray(spec.object_nbytes)))


def test_a_model_mixing_masked_and_float_tensors_is_refused() -> None:
    with pytest.raises(wire.SpecMismatch, match="masked vectors"):
        wire.ModelSpec.build([("masked", "U32", (D + 1,)), ("w", "F32", (3,))])
    body = wire.encode_tensors({"masked": np.zeros(4, np.uint32), "w": np.zeros(3, np.float32)})
    with pytest.raises(wire.SpecMismatch, match="masked vectors"):
        wire.ModelSpec.from_safetensors(body)


def test_a_masked_upload_to_a_float_model_is_refused() -> None:
    spec = wire.ModelSpec.from_safetensors(
        wire.encode_tensors({"masked": np.zeros(D + 1, np.float32)})
    )
    body = wire.encode_tensors({"masked": _masked()})
    with pytest.raises(wire.SpecMismatch, match="U32"):
        wire.decode_into(body, spec, memoryview(bytearray(spec.object_nbytes)))
