"""Helpers of the platform tests: every core part on any free port, so tests never collide."""

from __future__ import annotations

#: ``PlatformSettings`` fields that put every core part on a free port of its own.
ANY_PORTS: dict[str, int] = {
    "runtime_port": 0,
    "minio_port": 0,
    "minio_console_port": 0,
    "redis_port": 0,
}
#: The same, as the environment of a ``fedfaas`` command.
ANY_PORTS_ENV: dict[str, str] = {f"FEDFAAS_{k.upper()}": "0" for k in ANY_PORTS}
