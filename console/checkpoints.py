"""The checkpoints in MinIO, each with a presigned download link that expires.

The console lists the bucket with a read-only MinIO user (list and get, nothing else) and signs
each link with it: the link works for ``link_ttl_s`` seconds, for that one object, without a
login to MinIO, and carries no secret (a signature, not the user's key).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import urllib3
from minio import Minio
from minio.error import MinioException

from console.settings import ConsoleSettings
from console.upstream import UpstreamError
from core.checkpoints.keys import make_minio
from core.secretfiles import read_credentials

#: objects one listing shows at most (a job of many rounds lists its newest first)
MAX_OBJECTS = 500


class Checkpoints:
    """The bucket's objects, by job."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.client: Minio | None = None
        if settings.minio_credentials_file is not None:
            creds = read_credentials(settings.minio_credentials_file, "MinIO")
            self.client = make_minio(settings.minio_endpoint, creds.username, creds.password)

    def _minio(self) -> Minio:
        if self.client is None:
            raise UpstreamError(503, "minio", "no MinIO credentials file: no checkpoints to show")
        return self.client

    def _jobs(self) -> list[str]:
        m = self._minio()
        return sorted(
            o.object_name.rstrip("/")
            for o in m.list_objects(self.settings.bucket)
            if o.is_dir and o.object_name
        )

    def _objects(self, job: str) -> list[dict[str, Any]]:
        m = self._minio()
        ttl = timedelta(seconds=self.settings.link_ttl_s)
        found = [
            o
            for o in m.list_objects(self.settings.bucket, prefix=f"{job}/", recursive=True)
            if o.object_name and not o.is_dir
        ]
        found.sort(key=lambda o: str(o.object_name), reverse=True)  # newest round first
        out = []
        for o in found[:MAX_OBJECTS]:
            key = str(o.object_name)
            out.append(
                {
                    "key": key,
                    "size": o.size,
                    "modified": o.last_modified.isoformat() if o.last_modified else None,
                    "url": m.presigned_get_object(self.settings.bucket, key, expires=ttl),
                }
            )
        return out

    async def listing(self, job: str | None) -> dict[str, Any]:
        """The jobs with checkpoints and, for ``job``, its objects with their links."""
        try:
            jobs = await asyncio.to_thread(self._jobs)
            objects = await asyncio.to_thread(self._objects, job) if job else []
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise UpstreamError(502, "minio", f"cannot list the bucket: {exc}") from exc
        return {
            "bucket": self.settings.bucket,
            "jobs": jobs,
            "job": job,
            "objects": objects,
            "link_ttl_s": self.settings.link_ttl_s,
            "minio_console": self.settings.minio_console_url,
        }
