"""Object keys, names, errors and the MinIO clients: the writer's and the reader's
(:func:`make_minio`), and the HTTP client of the others (:func:`retrying_http`: provisioning,
the cache engine's cold store, :meth:`core.services.MinioServer.client`)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import certifi
import urllib3
from minio import Minio

DEFAULT_BUCKET = "fedfaas"
PART_SIZE = 64 << 20  # one PUT (no multipart) for objects up to 64 MiB
META_LIMIT = 1800  # S3 allows 2 KB of user metadata; keep room for our own keys
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class CheckpointError(Exception):
    """Base class of checkpoint errors."""


class CheckpointNotFound(CheckpointError):
    """The requested checkpoint object does not exist."""

    def __init__(self, job: str, round: int, what: str) -> None:
        super().__init__(f"no checkpoint {what!r} for job {job!r} round {round}")
        self.job, self.round, self.what = job, round, what


class CheckpointClosed(CheckpointError):
    """The writer was closed; nothing more can be queued."""


def _check_name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{kind} {value!r} must match {_NAME.pattern} to be an object key")
    return value


def round_prefix(job: str, round: int) -> str:
    """``<job>/rounds/<round:06d>/``."""
    if round < 0:
        raise ValueError(f"round must be >= 0, got {round}")
    return f"{_check_name('job', job)}/rounds/{round:06d}/"


def global_key(job: str, round: int) -> str:
    return round_prefix(job, round) + "global.safetensors"


def client_key(job: str, round: int, client_id: str) -> str:
    return round_prefix(job, round) + f"clients/{_check_name('client id', client_id)}.safetensors"


def meta_key(job: str, round: int) -> str:
    return round_prefix(job, round) + "meta.json"


def server_opt_key(job: str, round: int) -> str:
    """The job's server optimizer state after ``round`` (see :mod:`core.server_opt`)."""
    return round_prefix(job, round) + "server_opt.safetensors"


def _http(connect: float = 2.0, read: float = 60.0) -> urllib3.PoolManager:
    # No urllib3-level retries: the writer's own backoff loop owns retrying.
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect, read=read),
        retries=urllib3.Retry(total=0, connect=0, read=0, redirect=2),
        maxsize=4,
    )


#: sends again of a request MinIO answered 5xx, backing off from 0.5 s to at most 2 s (about
#: 35 s in all)
MINIO_RETRIES = 20


def retrying_http() -> urllib3.PoolManager:
    """minio's own default HTTP client (5-minute timeouts, 10 connections, the CA bundle of
    ``SSL_CERT_FILE`` or certifi's, a 500/502/503/504 sent again) with one change: a request
    is sent again after a backoff of 0.5 s doubling to 2 s, never after the ``Retry-After:
    60`` MinIO puts on a 503 (while it initialises after its readiness answers 200, or when
    busy). minio's default obeys it: provisioning right after a start slept a whole minute
    (``tests/platform/test_provision_minio.py``, 62 s in the default tier)."""
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=300, read=300),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(
            total=MINIO_RETRIES,
            backoff_factor=0.25,
            backoff_max=2.0,
            status_forcelist=(500, 502, 503, 504),
            respect_retry_after_header=False,
        ),
    )


def make_minio(endpoint: str, access_key: str, secret_key: str, secure: bool = False) -> Minio:
    """A MinIO client that fails fast instead of retrying inside urllib3."""
    return Minio(
        endpoint, access_key=access_key, secret_key=secret_key, secure=secure, http_client=_http()
    )


def _user_meta(meta: dict[str, Any]) -> dict[str, str]:
    out = {
        str(k): v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in meta.items()
    }
    size = sum(len(k) + len(v) for k, v in out.items())
    if size > META_LIMIT:
        raise ValueError(
            f"checkpoint metadata is {size} bytes; the limit is {META_LIMIT} "
            "(put large metadata in put_meta instead)"
        )
    for k in out:
        if not re.match(r"^[A-Za-z0-9-]+$", k):
            raise ValueError(f"metadata key {k!r} must be letters, digits and dashes")
    return out
