"""Reading checkpoints back: rounds, clients, global models, metadata, the latest round."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import urllib3
from minio import Minio
from minio.error import S3Error

from core.checkpoints.keys import (
    DEFAULT_BUCKET,
    CheckpointError,
    CheckpointNotFound,
    _check_name,
    client_key,
    global_key,
    make_minio,
    meta_key,
    round_prefix,
    server_opt_key,
)


class CheckpointReader:
    """Reads checkpoints written by :class:`CheckpointWriter` (FLStore's cold store, resume)."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str = DEFAULT_BUCKET,
        secure: bool = False,
    ) -> None:
        self._mc = make_minio(endpoint, access_key, secret_key, secure)
        self.bucket = bucket

    @classmethod
    def from_client(cls, mc: Minio, bucket: str = DEFAULT_BUCKET) -> CheckpointReader:
        self = cls.__new__(cls)
        self._mc, self.bucket = mc, bucket
        return self

    def _names(self, prefix: str, recursive: bool = False) -> list[str]:
        try:
            return [
                o.object_name
                for o in self._mc.list_objects(self.bucket, prefix=prefix, recursive=recursive)
                if o.object_name is not None
            ]
        except S3Error as exc:
            if exc.code == "NoSuchBucket":
                return []
            raise CheckpointError(f"listing {prefix!r}: {exc}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise CheckpointError(f"MinIO unreachable while listing {prefix!r}: {exc}") from exc

    def _get(self, key: str, job: str, round: int, what: str) -> bytes:
        try:
            resp = self._mc.get_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchBucket"):
                raise CheckpointNotFound(job, round, what) from exc
            raise CheckpointError(f"reading {key}: {exc}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise CheckpointError(f"MinIO unreachable while reading {key}: {exc}") from exc
        try:
            return bytes(resp.read())
        finally:
            resp.close()
            resp.release_conn()

    def jobs(self) -> list[str]:
        """Jobs that have at least one checkpoint."""
        return sorted(n.rstrip("/") for n in self._names("") if n.endswith("/"))

    def rounds(self, job: str) -> list[int]:
        """Rounds of ``job`` with any checkpoint object, ascending."""
        prefix = f"{_check_name('job', job)}/rounds/"
        out = []
        for n in self._names(prefix):
            tail = n[len(prefix) :].rstrip("/")
            if n.endswith("/") and tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    def clients(self, job: str, round: int) -> list[str]:
        """Client ids with an update stored for ``round``."""
        prefix = round_prefix(job, round) + "clients/"
        return sorted(
            n[len(prefix) :].removesuffix(".safetensors")
            for n in self._names(prefix)
            if n.endswith(".safetensors")
        )

    def get_global(self, job: str, round: int) -> bytes:
        return self._get(global_key(job, round), job, round, "global")

    def global_meta(self, job: str, round: int) -> dict[str, str]:
        """The user metadata stored with the global model (``sha256`` and put_global's meta)."""
        try:
            st = self._mc.stat_object(self.bucket, global_key(job, round))
        except S3Error as exc:
            raise CheckpointNotFound(job, round, "global") from exc
        md = st.metadata or {}
        out = {}
        for k, v in md.items():
            lk = k.lower()
            if lk.startswith("x-amz-meta-"):
                out[lk[len("x-amz-meta-") :]] = str(v)
        return out

    def get_client(self, job: str, round: int, client_id: str) -> bytes:
        return self._get(client_key(job, round, client_id), job, round, f"client {client_id}")

    def get_server_opt(self, job: str, round: int) -> bytes:
        """The server optimizer's state after ``round`` (:func:`core.server_opt.state_to_safetensors`)."""
        return self._get(server_opt_key(job, round), job, round, "server_opt")

    def get_meta(self, job: str, round: int) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(self._get(meta_key(job, round), job, round, "meta"))
        return meta

    def latest(self, job: str) -> tuple[int, bytes] | None:
        """``(round, global bytes)`` of the newest round that has a global model, or None."""
        for rnd in reversed(self.rounds(job)):
            with contextlib.suppress(CheckpointNotFound):
                return rnd, self.get_global(job, rnd)
        return None
