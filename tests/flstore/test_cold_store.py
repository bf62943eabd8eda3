"""The cold store reads what the platform's checkpoint writer puts in the real MinIO."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from safetensors.numpy import save

from cache_engine.cold_store import HEAD_BYTES, ColdStoreError, MinioColdStore
from cache_engine.keys import ObjectKey, global_model, meta, update
from core.checkpoints import CheckpointWriter
from core.services import MinioServer

pytestmark = pytest.mark.integration


def _store(minio_server: MinioServer, bucket: str | None = None) -> MinioColdStore:
    """The cold store on ``bucket`` (default: a new one of its own)."""
    bucket = bucket or f"t-{uuid.uuid4().hex[:12]}"
    return MinioColdStore(
        minio_server.endpoint, minio_server.access_key, minio_server.secret_key, bucket=bucket
    )


def test_rounds_written_by_the_checkpoint_writer_are_read_as_flat_vectors_and_metadata(
    minio_server: MinioServer,
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    w1 = {"b": np.arange(3, dtype=np.float16), "a": np.ones((2, 2), np.float32)}
    with CheckpointWriter(
        minio_server.endpoint, minio_server.access_key, minio_server.secret_key, bucket=bucket
    ) as w:
        w.put_global("job", 1, save(w1), {"version": 1})
        w.put_client("job", 1, "c1", save(w1))
        w.put_client("job", 2, "c1", save(w1))  # round 2 has no meta.json yet: not complete
        w.put_meta(
            "job",
            1,
            {"job": "job", "round": 1, "clients": {"c1": 12.0, "c9": 3.0}, "weight_sum": 15.0},
        )
        assert w.flush(30)
    cold = _store(minio_server, bucket)
    assert cold.rounds("job") == [1]
    assert cold.client_ids("job", 1) == ["c1"]  # c9 is in the metadata but has no update
    vec = cold.get(update("job", "c1", 1))
    np.testing.assert_array_equal(vec, np.array([1, 1, 1, 1, 0, 1, 2], np.float32))
    assert cold.get(global_model("job", 1)).dtype == np.float32  # type: ignore[union-attr]
    m = cold.get(meta("job", 1))
    assert m["client_meta"]["c1"]["n_samples"] == 12.0  # type: ignore[index]
    assert cold.size(update("job", "c1", 1)) > 0


def test_ranged_reads_give_slices_of_the_flat_vector(minio_server: MinioServer) -> None:
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    cold = _store(minio_server, bucket)
    rng = np.random.default_rng(0)
    tensors = {
        "z.weight": rng.normal(size=(7, 5)).astype(np.float32),
        "a.bias": np.arange(11, dtype=np.float16),
        "m.weight": rng.normal(size=(40,)).astype(np.float64),
    }
    key = update("job", "c1", 1)
    cold.put_bytes(key, save(tensors))
    whole = cold.get(key)
    assert isinstance(whole, np.ndarray) and whole.shape == (86,)
    index = cold.header(key)
    for a, b in ((0, 86), (0, 11), (5, 60), (50, 51), (11, 51), (30, 30)):
        np.testing.assert_array_equal(cold.read_range(key, a, b, index), whole[a:b])
    with pytest.raises(ColdStoreError, match="outside"):
        cold.read_range(key, 80, 90, index)


def test_a_header_is_one_ranged_read_and_a_longer_one_two(minio_server: MinioServer) -> None:
    cold = _store(minio_server)
    reads: list[tuple[int, int]] = []
    plain = cold.get_bytes_range

    def counted(key: ObjectKey, offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return plain(key, offset, length)

    cold.get_bytes_range = counted  # type: ignore[method-assign]
    tensors = {"b": np.arange(3, dtype=np.float32), "a": np.ones(4, np.float32)}
    for i, extra in enumerate((None, {"note": "x" * (HEAD_BYTES + 10)})):
        key = update("job", f"c{i}", 1)
        cold.put_bytes(key, save(tensors, metadata=extra))
        reads.clear()
        index = cold.header(key)
        assert len(reads) == (1 if extra is None else 2)
        np.testing.assert_array_equal(cold.read_range(key, 2, 6, index), [1, 1, 0, 1])


def test_float32_tensors_next_to_each_other_are_one_ranged_read_into_the_buffer(
    minio_server: MinioServer,
) -> None:
    """A stream's chunk of a model whose float32 tensors follow each other in the file is one
    ranged read per chunk, written straight into the stream's buffer (one read per tensor
    before: a chunk across a tensor boundary was two, each copied through bytes)."""
    cold = _store(minio_server)
    gets: list[tuple[int, int]] = []
    plain = cold.client.get_object

    def counted(bucket: str, name: str, offset: int = 0, length: int = 0) -> object:
        gets.append((offset, length))
        return plain(bucket, name, offset=offset, length=length)

    cold.client.get_object = counted  # type: ignore[method-assign]
    rng = np.random.default_rng(1)
    tensors = {n: rng.normal(size=s).astype(np.float32) for n, s in (("a", 30), ("b", (4, 5)))}
    tensors["c"] = rng.normal(size=50).astype(np.float32)
    key = update("job", "c1", 1)
    cold.put_bytes(key, save(tensors))
    whole = cold.get(key)
    assert isinstance(whole, np.ndarray)
    index = cold.header(key)
    assert index.flat_start() is not None  # float32 from end to end
    buf = np.full(100, np.nan, np.float32)
    for a, b in ((0, 100), (25, 60), (31, 32)):
        gets.clear()
        got = cold.read_range(key, a, b, index, out=buf[: b - a])
        assert np.shares_memory(got, buf)
        np.testing.assert_array_equal(buf[: b - a], whole[a:b])
        assert len(gets) == index.reads(a, b) == 1, gets
    # tensors of other dtypes between them: one read per run of float32, values unchanged
    mixed = {**tensors, "b": tensors["b"].astype(np.float16)}
    cold.put_bytes(key, save(mixed))
    index = cold.header(key)
    assert index.flat_start() is None
    gets.clear()
    got = cold.read_range(key, 0, 100, index)
    assert len(gets) == index.reads(0, 100) == 3
    np.testing.assert_array_equal(got, cold.get(key))
