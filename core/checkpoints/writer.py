"""The background checkpoint writer: in-order uploads, spill to disk, retry forever."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from minio.error import S3Error

from core.checkpoints.keys import (
    DEFAULT_BUCKET,
    PART_SIZE,
    CheckpointClosed,
    CheckpointError,
    CheckpointNotFound,
    _check_name,
    _user_meta,
    client_key,
    global_key,
    make_minio,
    meta_key,
    server_opt_key,
)
from core.checkpoints.reader import CheckpointReader

log = logging.getLogger(__name__)


@dataclass
class _Item:
    seq: int
    key: str
    size: int
    content_type: str
    metadata: dict[str, str]
    data: bytes | None = None  # in memory ...
    path: Path | None = None  # ... or spilled to the spool folder

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.path is not None
        return open(self.path, "rb")  # noqa: SIM115 - closed by the caller

    def read(self) -> bytes:
        with self.open() as f:
            return f.read()


class CheckpointWriter:
    """Uploads checkpoints to MinIO in the background; never drops an object.

    Parameters
    ----------
    endpoint, access_key, secret_key, secure : MinIO address and credentials.
    bucket : bucket for every job (created on the first successful contact).
    spool_dir : folder for spilled objects; a writer started on a folder left non-empty by an
        earlier one uploads those objects first. Default: a fresh temporary folder.
    memory_limit : bytes of queued objects kept in memory before spilling to ``spool_dir``.
    max_backoff : ceiling of the retry delay in seconds while MinIO is unreachable.
    """

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str = DEFAULT_BUCKET,
        secure: bool = False,
        *,
        spool_dir: Path | None = None,
        memory_limit: int = 256 << 20,
        max_backoff: float = 5.0,
    ) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self._mc = make_minio(endpoint, access_key, secret_key, secure)
        self._own_spool = spool_dir is None
        self.spool_dir = Path(spool_dir or tempfile.mkdtemp(prefix="fedfaas-ckpt-"))
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._lockf = open(self.spool_dir / ".lock", "w")  # noqa: SIM115 - held while open
        try:
            fcntl.flock(self._lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lockf.close()
            raise CheckpointError(
                f"spool folder {self.spool_dir} is used by another writer"
            ) from exc
        self.memory_limit = memory_limit
        self.max_backoff = max_backoff
        self._queue: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._mem_bytes = 0
        self._closed = False
        self._stop = False
        self._bucket_ok = False
        self._seq = 0
        self.written = 0
        self.retries = 0
        self.last_error: str | None = None
        self._recover_spool()
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ queueing
    def _recover_spool(self) -> None:
        for meta_path in sorted(self.spool_dir.glob("*.json")):
            bin_path = meta_path.with_suffix(".bin")
            if not bin_path.exists():
                meta_path.unlink()
                continue
            d = json.loads(meta_path.read_text())
            seq = int(meta_path.stem)
            self._queue.append(
                _Item(
                    seq,
                    d["key"],
                    int(d["size"]),
                    d["content_type"],
                    dict(d["metadata"]),
                    path=bin_path,
                )
            )
            self._seq = max(self._seq, seq + 1)
        for stray in self.spool_dir.glob("*.bin"):
            if not stray.with_suffix(".json").exists():
                stray.unlink()
        for tmp in self.spool_dir.glob("*.tmp"):
            tmp.unlink()
        if self._queue:
            log.info(
                "checkpoint spool %s: %d objects left by an earlier writer",
                self.spool_dir,
                len(self._queue),
            )

    def _spill(self, item: _Item) -> None:
        assert item.data is not None
        stem = self.spool_dir / f"{item.seq:012d}"
        tmp = stem.with_suffix(".bin.tmp")
        tmp.write_bytes(item.data)
        os.replace(tmp, stem.with_suffix(".bin"))
        desc = {
            "key": item.key,
            "size": item.size,
            "content_type": item.content_type,
            "metadata": item.metadata,
        }
        tmp_meta = stem.with_suffix(".json.tmp")
        tmp_meta.write_text(json.dumps(desc))
        os.replace(tmp_meta, stem.with_suffix(".json"))
        item.path, item.data = stem.with_suffix(".bin"), None

    def _put(self, key: str, data: bytes, content_type: str, metadata: dict[str, str]) -> None:
        with self._cv:
            if self._closed:
                raise CheckpointClosed(f"writer closed; {key} not queued")
            item = _Item(self._seq, key, len(data), content_type, metadata, data=bytes(data))
            self._seq += 1
            if self._mem_bytes + item.size > self.memory_limit:
                self._spill(item)
            else:
                self._mem_bytes += item.size
            self._queue.append(item)
            self._cv.notify_all()

    def put_global(
        self, job: str, round: int, data: bytes, meta: dict[str, Any] | None = None
    ) -> str:
        """Queue the global model of ``round``; ``meta`` (small) becomes object metadata."""
        md = _user_meta(meta or {})
        md["sha256"] = hashlib.sha256(data).hexdigest()
        key = global_key(job, round)
        self._put(key, data, "application/octet-stream", md)
        return key

    def put_client(self, job: str, round: int, client_id: str, data: bytes) -> str:
        """Queue one client's update of ``round``."""
        key = client_key(job, round, client_id)
        self._put(
            key, data, "application/octet-stream", {"sha256": hashlib.sha256(data).hexdigest()}
        )
        return key

    def put_server_opt(self, job: str, round: int, data: bytes) -> str:
        """Queue the server optimizer's state after ``round``, kept beside its global model."""
        key = server_opt_key(job, round)
        self._put(
            key, data, "application/octet-stream", {"sha256": hashlib.sha256(data).hexdigest()}
        )
        return key

    def server_opt(self, job: str, round: int) -> bytes | None:
        """The server optimizer's state after ``round`` (queued or in MinIO), None if neither.

        Raises :class:`CheckpointError` when MinIO cannot be read and nothing is queued.
        """
        key = server_opt_key(job, round)
        with self._cv:
            queued = next((i for i in reversed(self._queue) if i.key == key), None)
        if queued is not None:
            return queued.read()
        try:
            return CheckpointReader.from_client(self._mc, self.bucket).get_server_opt(job, round)
        except CheckpointNotFound:
            return None

    def put_meta(self, job: str, round: int, meta: dict[str, Any]) -> str:
        """Queue the round's metadata as ``meta.json`` (replaces an earlier one)."""
        key = meta_key(job, round)
        self._put(key, json.dumps(meta, sort_keys=True, indent=1).encode(), "application/json", {})
        return key

    # ------------------------------------------------------------------ background upload
    def _ensure_bucket(self) -> None:
        if self._bucket_ok:
            return
        if not self._mc.bucket_exists(self.bucket):
            try:
                self._mc.make_bucket(self.bucket)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
        self._bucket_ok = True

    def _upload(self, item: _Item) -> None:
        self._ensure_bucket()
        metadata: dict[str, str | list[str] | tuple[str]] | None = (
            dict(item.metadata) if item.metadata else None
        )
        with item.open() as f:
            self._mc.put_object(
                self.bucket,
                item.key,
                f,
                item.size,
                content_type=item.content_type,
                metadata=metadata,
                part_size=PART_SIZE,
            )

    def _run(self) -> None:
        backoff = 0.1
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                item = self._queue[0]
            try:
                self._upload(item)
            except Exception as exc:  # noqa: BLE001 - every failure is retried, never dropped
                self.retries += 1
                if self.last_error is None:
                    log.warning("checkpoint upload of %s failed, retrying: %s", item.key, exc)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._bucket_ok = False
                with self._cv:
                    self._cv.notify_all()
                    self._cv.wait_for(lambda: self._stop, timeout=backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            if self.last_error is not None:
                log.info("checkpoint store %s reachable again", self.endpoint)
            backoff, self.last_error = 0.1, None
            with self._cv:
                # close() may have given up on this upload and spooled the queue meanwhile;
                # the spooled copy is then sent again later (an idempotent PUT).
                if self._queue and self._queue[0] is item:
                    self._queue.popleft()
                if item.data is not None:
                    self._mem_bytes -= item.size
                if item.path is not None:
                    item.path.unlink(missing_ok=True)
                    item.path.with_suffix(".json").unlink(missing_ok=True)
                self.written += 1
                self._cv.notify_all()
            log.debug("checkpoint %s written (%d bytes)", item.key, item.size)

    # ------------------------------------------------------------------ control
    def pending(self) -> int:
        """Objects queued and not yet confirmed by MinIO."""
        with self._cv:
            return len(self._queue)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {
                "pending": len(self._queue),
                "pending_memory_bytes": self._mem_bytes,
                "spilled": sum(1 for i in self._queue if i.path is not None),
                "written": self.written,
                "retries": self.retries,
                "last_error": self.last_error,
                "spool_dir": str(self.spool_dir),
            }

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued object is in MinIO; False if ``timeout`` ran out first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue, timeout=timeout)

    def wait_sent(self, key: str, timeout: float | None = None) -> bool:
        """Wait until ``key``, and so everything queued before it, is in MinIO.

        Uploads go in queue order, so this does not wait for objects queued later (the next
        round's updates); False if ``timeout`` ran out first.
        """
        with self._cv:
            return self._cv.wait_for(
                lambda: all(i.key != key for i in self._queue), timeout=timeout
            )

    def close(self, timeout: float = 30.0) -> bool:
        """Flush for up to ``timeout`` s, then stop; unsent objects stay in the spool folder.

        Returns True when nothing was left behind.
        """
        with self._cv:
            self._closed = True
        done = self.flush(timeout)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=max(5.0, timeout))
        with self._cv:
            for item in self._queue:
                if item.data is not None:
                    self._spill(item)
            left = len(self._queue)
            self._queue.clear()
            self._mem_bytes = 0
        if left:
            log.warning(
                "checkpoint writer closed with %d objects unsent; kept in %s", left, self.spool_dir
            )
        self._lockf.close()
        if self._own_spool and not left:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
        return done and not left

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ resume
    def _pending_global(self, job: str) -> tuple[int, bytes] | None:
        prefix = f"{_check_name('job', job)}/rounds/"
        best: _Item | None = None
        with self._cv:
            for item in self._queue:
                if item.key.startswith(prefix) and item.key.endswith("/global.safetensors"):
                    rnd = int(item.key[len(prefix) :].split("/")[0])
                    if best is None or rnd >= int(best.key[len(prefix) :].split("/")[0]):
                        best = item
        if best is None:
            return None
        return int(best.key[len(prefix) :].split("/")[0]), best.read()

    def latest(self, job: str) -> tuple[int, bytes] | None:
        """The newest global model of ``job`` (queued or in MinIO) as ``(round, bytes)``.

        Raises :class:`CheckpointError` when MinIO cannot be read and nothing is queued.
        """
        queued = self._pending_global(job)
        try:
            stored = CheckpointReader.from_client(self._mc, self.bucket).latest(job)
        except CheckpointError:
            if queued is not None:
                return queued
            raise
        if queued is not None and (stored is None or queued[0] >= stored[0]):
            return queued
        return stored
