"""Settings of a baseline server (env prefix ``FEDFAAS_BASELINE_``), also its command line."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic_settings import SettingsConfigDict

from core.cmdline import CommandLineSettings


class BaselineSettings(CommandLineSettings):
    """Which store an always-on baseline reads, and where it listens.

    Attributes
    ----------
    backend
        ``minio`` (ObjStore-Agg) or ``redis`` (Cache-Agg).
    minio_endpoint, minio_credentials_file
        The cold store (both backends read round metadata there) and a user that reads it (a
        0600 credentials file, see :mod:`core.secretfiles`; required).
    redis_url, redis_credentials_file
        Where Cache-Agg mirrors and reads objects, and its user there (required by ``redis``).
    gram_memo
        Keep the inner products between objects across queries, as the cache functions do
        (:class:`~bench.baselines.server.ObjectGramMemo`); ``--no-gram-memo`` recomputes them.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_BASELINE_", extra="ignore")

    MODULE: ClassVar[str] = "bench.baselines"
    DESCRIPTION: ClassVar[str] = "ObjStore-Agg / Cache-Agg baseline server"
    FLAGS: ClassVar[dict[str, str]] = {
        "backend": "--backend",
        "host": "--host",
        "port": "--port",
        "minio_endpoint": "--minio",
        "minio_credentials_file": "--minio-credentials-file",
        "redis_url": "--redis",
        "redis_credentials_file": "--redis-credentials-file",
        "gram_memo": "--no-gram-memo",
    }

    backend: Literal["minio", "redis"] = "minio"
    host: str = "127.0.0.1"
    port: int = 8095
    minio_endpoint: str = "127.0.0.1:9000"
    minio_credentials_file: Path | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_credentials_file: Path | None = None
    gram_memo: bool = True
