"""Settings of a baseline server (env prefix ``FEDFAAS_BASELINE_``), also its command line."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic_settings import SettingsConfigDict

from fedfaas.cmdline import CommandLineSettings


class BaselineSettings(CommandLineSettings):
    """Which store an always-on baseline reads, and where it listens.

    Attributes
    ----------
    backend
        ``minio`` (ObjStore-Agg) or ``redis`` (Cache-Agg).
    minio_endpoint, minio_access_key, minio_secret_key
        The cold store (both backends read round metadata there).
    redis_url
        Where Cache-Agg mirrors and reads objects.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_BASELINE_", extra="ignore")

    MODULE: ClassVar[str] = "bench.baselines"
    DESCRIPTION: ClassVar[str] = "ObjStore-Agg / Cache-Agg baseline server"
    #: never on a command line: ``FEDFAAS_BASELINE_MINIO_ACCESS_KEY`` / ``_SECRET_KEY``
    SECRETS: ClassVar[frozenset[str]] = frozenset({"minio_access_key", "minio_secret_key"})
    FLAGS: ClassVar[dict[str, str]] = {
        "backend": "--backend",
        "host": "--host",
        "port": "--port",
        "minio_endpoint": "--minio",
        "redis_url": "--redis",
    }

    backend: Literal["minio", "redis"] = "minio"
    host: str = "127.0.0.1"
    port: int = 8095
    minio_endpoint: str = "127.0.0.1:9000"
    minio_access_key: str = "fedfaas"
    minio_secret_key: str = "fedfaas-secret-key"
    redis_url: str = "redis://127.0.0.1:6379/0"
