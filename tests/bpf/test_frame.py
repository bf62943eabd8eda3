"""The 64-byte frame: layout, round trip, validation."""

from __future__ import annotations

import struct

import pytest

from bpf import FLAG_LAZY, FRAME_SIZE, Frame, FrameError, Kind, Role


def _full_frame() -> Frame:
    return Frame(
        dst=0xDEADBEEF,
        src=7,
        kind=Kind.PARTIAL,
        flags=Role.MIDDLE | FLAG_LAZY,
        job=42,
        key=bytes(range(16)),
        weight=1234.5,
        round=9,
        count=3,
        parent=11,
        seq=77,
        t_ns=2**63 + 5,
    )


def test_frame_encodes_to_exactly_64_bytes_and_round_trips() -> None:
    frame = _full_frame()
    raw = frame.encode()
    assert len(raw) == FRAME_SIZE == 64
    assert Frame.decode(raw) == frame
    assert Frame.decode(bytearray(raw)) == frame
    assert Frame.decode(memoryview(raw)) == frame


def test_fields_sit_at_the_offsets_of_the_shared_contract() -> None:
    raw = _full_frame().encode()
    assert struct.unpack_from("<I", raw, 0)[0] == 0xDEADBEEF  # dst, read by the eBPF program
    assert struct.unpack_from("<I", raw, 4)[0] == 7
    assert struct.unpack_from("<H", raw, 8)[0] == Kind.PARTIAL == 3
    assert struct.unpack_from("<H", raw, 10)[0] == 0x102
    assert struct.unpack_from("<I", raw, 12)[0] == 42
    assert raw[16:32] == bytes(range(16))
    assert struct.unpack_from("<d", raw, 32)[0] == 1234.5
    assert struct.unpack_from("<IIII", raw, 40) == (9, 3, 11, 77)
    assert struct.unpack_from("<Q", raw, 56)[0] == 2**63 + 5


def test_kind_numbers_match_the_contract() -> None:
    assert [k.value for k in Kind] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert [k.name for k in Kind] == [
        "UPDATE",
        "TASK",
        "PARTIAL",
        "ACK",
        "RESULT",
        "PING",
        "SHUTDOWN",
        "GRANT",
        "CHECKPOINT",
        "SPARE",
        "SHARD",
        "SHARD_DONE",
        "FAILED",
    ]


def test_task_flags_expose_role_and_lazy_mode() -> None:
    task = Frame(dst=1, src=2, kind=Kind.TASK, flags=Role.TOP | FLAG_LAZY)
    assert task.role is Role.TOP and task.lazy
    assert Frame(dst=1, src=2, kind=Kind.TASK, flags=Role.LEAF).lazy is False
    assert Frame(dst=1, src=2, kind=Kind.ACK).role is None


def test_kind_given_as_int_becomes_the_enum() -> None:
    assert Frame(dst=1, src=2, kind=1).kind is Kind.UPDATE  # type: ignore[arg-type]


def test_frame_is_immutable() -> None:
    frame = _full_frame()
    with pytest.raises(AttributeError):
        frame.dst = 3  # type: ignore[misc]


@pytest.mark.parametrize("size", [0, 63, 65, 128])
def test_decode_rejects_a_buffer_that_is_not_64_bytes(size: int) -> None:
    with pytest.raises(FrameError, match="64 bytes"):
        Frame.decode(bytes(size))


def test_decode_rejects_an_unknown_kind() -> None:
    raw = bytearray(_full_frame().encode())
    struct.pack_into("<H", raw, 8, 99)
    with pytest.raises(FrameError, match="unknown frame kind"):
        Frame.decode(raw)


@pytest.mark.parametrize(
    "field,value",
    [("dst", -1), ("src", 2**32), ("job", 2**32), ("flags", 2**16), ("seq", 1.5), ("t_ns", 2**64)],
)
def test_out_of_range_fields_are_refused_at_construction(field: str, value: object) -> None:
    kwargs: dict[str, object] = {"dst": 1, "src": 2, "kind": Kind.ACK, field: value}
    with pytest.raises(FrameError, match=field):
        Frame(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [b"", b"x" * 15, b"x" * 17, "0123456789abcdef"])
def test_key_must_be_16_bytes(key: object) -> None:
    with pytest.raises(FrameError, match="16 bytes"):
        Frame(dst=1, src=2, kind=Kind.UPDATE, key=key)  # type: ignore[arg-type]


def test_encode_as_replaces_only_source_and_time() -> None:
    frame = _full_frame()
    stamped = Frame.decode(frame.encode_as(src=99, t_ns=5))
    assert stamped.src == 99 and stamped.t_ns == 5
    assert stamped.key == frame.key and stamped.dst == frame.dst and stamped.weight == frame.weight
