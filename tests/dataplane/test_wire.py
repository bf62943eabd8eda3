"""The wire format: safetensors in, flat 64-byte-aligned float32 objects, safetensors out."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core import wire


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "conv.bias": rng.standard_normal(4).astype(np.float32),
        "fc.weight": rng.standard_normal((10, 7)).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
        "half": rng.standard_normal(5).astype(np.float16),
    }


def decode(data: bytes, spec: wire.ModelSpec, chunk: int = 1 << 30, **kw: object) -> bytearray:
    """Feed ``data`` to an UpdateDecoder in chunks of at most ``chunk`` bytes."""
    buf = bytearray(b"\xab" * spec.object_nbytes)
    dec = wire.UpdateDecoder(spec, memoryview(buf), len(data), **kw)  # type: ignore[arg-type]
    pos = 0
    while not dec.done and pos < len(data):
        b = dec.get_buffer()
        n = min(len(b), chunk, len(data) - pos)
        b[:n] = data[pos : pos + n]
        pos += n
        dec.buffer_updated(n)
    dec.finish()
    return buf


def test_spec_is_canonical_sorted_back_to_back_and_64_byte_aligned() -> None:
    spec = wire.ModelSpec.from_safetensors(st_save(model()))
    names = [t.name for t in spec.tensors]
    assert names == sorted(names)
    assert spec.tensors[0].offset == wire.HEADER_SIZE
    # no gap between tensors: the data region starts with the flat vector FLStore holds
    for a, b in zip(spec.tensors, spec.tensors[1:], strict=False):
        assert b.offset == a.offset + 4 * a.numel
    assert any(t.numel % 16 for t in spec.tensors)  # the model has sizes that used to be padded
    assert spec.object_nbytes % 64 == 0
    assert spec.object_nbytes - 64 < wire.HEADER_SIZE + 4 * spec.numel <= spec.object_nbytes
    assert wire.ModelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_spec_hash_changes_with_any_shape_or_dtype() -> None:
    a = wire.ModelSpec.build([("w", "F32", (3, 4))])
    assert a.hash != wire.ModelSpec.build([("w", "F32", (4, 3))]).hash
    assert a.hash != wire.ModelSpec.build([("w", "F16", (3, 4))]).hash
    assert a.hash == wire.ModelSpec.build([("w", "F32", (3, 4))]).hash


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 30])
def test_streaming_decode_places_every_tensor_at_its_offset(chunk: int) -> None:
    m = model()
    data = st_save(m)
    spec = wire.ModelSpec.from_safetensors(data)
    buf = decode(data, spec, chunk)
    views = wire.tensor_views(buf, spec)
    for name, arr in m.items():
        np.testing.assert_array_equal(views[name], arr.astype(np.float32))
    # padding between tensors is zero, so the flat vector sums like the tensors do
    flat = wire.flat_view(buf, spec)
    assert np.isclose(
        flat.astype(np.float64).sum(), sum(float(a.astype(np.float64).sum()) for a in m.values())
    )


def test_f32_tensors_are_received_straight_into_the_destination() -> None:
    data = st_save({"w": np.ones(1000, np.float32)})
    spec = wire.ModelSpec.from_safetensors(data)
    dst = bytearray(spec.object_nbytes)
    dec = wire.UpdateDecoder(spec, memoryview(dst), len(data))
    while dec.get_buffer().nbytes < 4000:  # header phases
        b = dec.get_buffer()
        n = len(b)
        b[:] = data[dec.received : dec.received + n]
        dec.buffer_updated(n)
    b = dec.get_buffer()
    assert b.obj is dst  # a view of the store object itself, not a scratch buffer


def test_encode_round_trips_through_the_safetensors_library() -> None:
    m = model(3)
    data = st_save(m)
    spec = wire.ModelSpec.from_safetensors(data)
    buf = decode(data, spec)
    out = st_load(wire.encode(buf, spec, {"version": "1"}))
    assert set(out) == set(m)
    for k, v in m.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        np.testing.assert_array_equal(out[k], v)


def test_bf16_is_widened_and_rounded_back() -> None:
    vals = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bf = (vals.view(np.uint32) >> 16).astype(np.uint16)
    header = {"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + bf.tobytes()
    spec = wire.ModelSpec.from_safetensors(data)
    buf = decode(data, spec, chunk=3)
    np.testing.assert_array_equal(wire.tensor_views(buf, spec)["x"], vals)
    back = wire.encode(buf, spec)
    assert back.endswith(bf.tobytes())


def test_header_and_object_header_round_trip() -> None:
    spec = wire.ModelSpec.build([("w", "F32", (5,))])
    buf = bytearray(spec.object_nbytes)
    wire.write_header(buf, spec, kind=wire.KIND_PARTIAL, weight=12.5, count=3, round=4)
    h = wire.read_header(buf)
    assert (h.kind, h.spec_hash, h.weight, h.count, h.round) == (
        wire.KIND_PARTIAL,
        spec.hash,
        12.5,
        3,
        4,
    )
    with pytest.raises(wire.MalformedHeader):
        wire.read_header(bytes(64))


def _raw(header: object, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


SPEC = wire.ModelSpec.build([("a", "F32", (2,)), ("b", "F32", (3,))])
GOOD = {
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 20]},
}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x05\x00", wire.Truncated),
        (struct.pack("<Q", 4) + b"{{{{", wire.MalformedHeader),
        (struct.pack("<Q", 2) + b"[]", wire.MalformedHeader),
        (struct.pack("<Q", 1 << 40) + b"{}", wire.HeaderTooLarge),
        (
            _raw({**GOOD, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, bytes(24)),
            wire.MalformedHeader,
        ),
        (
            _raw({**GOOD, "a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(20)),
            wire.MalformedHeader,
        ),
        (
            _raw(
                {**GOOD, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}},
                bytes(20),
            ),
            wire.MalformedHeader,
        ),
        (
            _raw(
                {**GOOD, "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]}}, bytes(24)
            ),
            wire.MalformedHeader,
        ),
        (_raw({"a": GOOD["a"]}, bytes(8)), wire.SpecMismatch),
        (
            _raw(
                {**GOOD, "c": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]}}, bytes(24)
            ),
            wire.SpecMismatch,
        ),
        (
            _raw(
                {**GOOD, "b": {"dtype": "F32", "shape": [1, 3], "data_offsets": [8, 20]}}, bytes(20)
            ),
            wire.SpecMismatch,
        ),
        (
            _raw({**GOOD, "b": {"dtype": "I32", "shape": [3], "data_offsets": [8, 20]}}, bytes(20)),
            wire.SpecMismatch,
        ),
        (
            _raw({**GOOD, "b": {"dtype": "C64", "shape": [3], "data_offsets": [8, 20]}}, bytes(20)),
            wire.SpecMismatch,
        ),
        (_raw(GOOD, bytes(19)), wire.SizeMismatch),
        (_raw(GOOD, bytes(21)), wire.SizeMismatch),
        (_raw(GOOD, np.array([1, 2, 3, np.nan, 5], np.float32).tobytes()), wire.NonFinite),
        (_raw(GOOD, np.array([1, 2, 3, np.inf, 5], np.float32).tobytes()), wire.NonFinite),
        (_raw(GOOD, np.array([1, 2, 3, -np.inf, 5], np.float32).tobytes()), wire.NonFinite),
    ],
)
def test_bad_bodies_raise_a_wire_error_with_a_code(
    data: bytes, error: type[wire.WireError]
) -> None:
    with pytest.raises(error) as info:
        decode(data, SPEC, chunk=5, max_header=4096)
    assert info.value.code and info.value.detail


@pytest.mark.parametrize("chunk", [3, 4096])
def test_incremental_finite_check_catches_nan_and_inf_while_streaming(chunk: int) -> None:
    for bad in (np.nan, np.inf):
        vals = np.arange(5, dtype=np.float32)
        vals[3] = bad
        data = _raw(GOOD, vals.tobytes())
        with pytest.raises(wire.NonFinite):
            decode(data, SPEC, chunk=chunk, check_finite=True)
    decode(
        _raw(GOOD, np.arange(5, dtype=np.float32).tobytes()), SPEC, chunk=chunk, check_finite=True
    )


def test_truncated_body_is_reported_by_finish() -> None:
    data = _raw(GOOD, bytes(20))
    dst = bytearray(SPEC.object_nbytes)
    dec = wire.UpdateDecoder(SPEC, memoryview(dst), len(data))
    for _ in range(3):
        b = dec.get_buffer()
        n = len(b)
        b[:] = data[dec.received : dec.received + n]
        dec.buffer_updated(n)
    with pytest.raises(wire.Truncated):
        dec.finish()


def test_header_bound_is_checked_before_reading_the_json() -> None:
    data = _raw({**GOOD, "__metadata__": {"pad": "x" * 5000}}, bytes(20))
    with pytest.raises(wire.HeaderTooLarge):
        decode(data, SPEC, max_header=4096)
    decode(data, SPEC, max_header=8192)


def test_huge_finite_values_pass_the_finite_check() -> None:
    data = _raw(GOOD, np.full(5, 3.4e38, np.float32).tobytes())
    decode(data, SPEC)


def test_encode_tensors_and_decode_tensors_round_trip() -> None:
    m = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array([3], np.int64)}
    out = wire.decode_tensors(wire.encode_tensors(m))
    np.testing.assert_array_equal(out["x"], m["x"])
    np.testing.assert_array_equal(out["n"], [3.0])
    assert st_load(wire.encode_tensors(m))["n"].dtype == np.int64


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_encode_view_on_threads_is_byte_identical_to_encode(threads: int) -> None:
    items = [("a", "F32", (3, 5)), ("b", "BF16", (7,)), ("c", "F16", (1,)), ("d", "I64", (9, 2))]
    spec = wire.ModelSpec.build(items)
    buf = bytearray(spec.object_nbytes)
    rng = np.random.default_rng(3)
    for t in spec.tensors:
        np.frombuffer(buf, np.float32, t.numel, t.offset)[:] = rng.normal(size=t.numel) * 50
    want = wire.encode(buf, spec, {"round": "2"})
    got = wire.encode_view(buf, spec, {"round": "2"}, threads=threads)
    assert got.readonly and bytes(got) == want
    assert wire.parse_raw_header(bytes(got), wire.DEFAULT_MAX_HEADER)[0]["a"]["shape"] == [3, 5]
