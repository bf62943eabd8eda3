"""Helpers of the platform tests: every core part on any free port, so tests never collide."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedfaas.platform.context import Context

#: ``PlatformSettings`` fields that put every core part on a free port of its own.
ANY_PORTS: dict[str, int] = {
    "runtime_port": 0,
    "minio_port": 0,
    "minio_console_port": 0,
    "redis_port": 0,
}
#: The same, as the environment of a ``fedfaas`` command.
ANY_PORTS_ENV: dict[str, str] = {f"FEDFAAS_{k.upper()}": "0" for k in ANY_PORTS}

#: A port of every part (runtime 1001 ... prometheus 1011), for the tests that read the
#: command lines ``fedfaas up`` renders (nothing listens on them).
PART_PORTS: dict[str, int] = {
    name: 1001 + i
    for i, name in enumerate(
        ("runtime", "minio", "minio_console", "redis", "gateway", "gateway_node1")
        + ("cache_engine", "control_plane", "request_tracker", "console", "prometheus")
    )
}


def part_context(state_dir: Path) -> Context:
    """The context ``fedfaas up`` renders the parts' command lines from: :data:`PART_PORTS`
    on 127.0.0.1, state (and secret files, made here) under ``state_dir``."""
    from fedfaas.platform import credentials
    from fedfaas.platform.context import Context

    ctx = Context(state_dir, "127.0.0.1", state_dir / "stack.yml", "ab" * 16, dict(PART_PORTS))
    credentials.ensure(ctx.secrets_dir)
    return ctx
