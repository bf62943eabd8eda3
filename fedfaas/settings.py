"""Settings of the one-machine platform (``fedfaas up | down | status``).

Read once from the environment (prefix ``FEDFAAS_``) and from the command line, which wins.
Every default works on one machine out of the box.

Ports follow one rule: unset means "the usual port if it is free, else any free port"; ``0``
means "any free port"; any other number means "exactly this port", and ``fedfaas up`` stops
with a clear error if it is taken.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The usual port of each part when nothing is configured (the runtime, the OpenFaaS gateway
#: of the node, on OpenFaaS's 8080: over TLS, ``fedfaas up``'s default, ``faas-cli`` takes
#: ``--gateway https://127.0.0.1:8080`` with ``SSL_CERT_FILE`` naming the platform's CA;
#: MinIO and Redis on their own defaults).
DEFAULT_PORTS: dict[str, int] = {
    "runtime": 8080,
    "minio": 9000,
    "minio_console": 9001,
    "redis": 6379,
}


class PlatformSettings(BaseSettings):
    """Where the platform keeps its state, which ports it takes, and how long it waits.

    Attributes
    ----------
    state_dir
        One folder for state, secrets, data and logs (``FEDFAAS_STATE_DIR``).
    stack_file
        The OpenFaaS stack deployed by ``fedfaas up`` (``FEDFAAS_STACK_FILE``).
    host
        Loopback address every part binds to. Nothing listens beyond it.
    runtime_port, minio_port, minio_console_port, redis_port
        Ports of the parts; see the module docstring for ``None`` and ``0``.
    ports
        Ports of the optional parts, by port name (``FEDFAAS_PORTS='{"gateway": 8081}'``).
    with_parts
        Optional parts to run too (``FEDFAAS_WITH_PARTS='["gateway"]'``, ``["all"]``): the node
        gateway, cache engine, request tracker, control plane.
    start_timeout
        Seconds each part may take to become ready.
    stop_timeout
        Seconds a part gets after SIGTERM before SIGKILL: longer than any component's own
        bounded stop (the runtime's is 30 s, the services' 20 s), which ends the process first
        and logs what it abandons; a clean stop takes a second or two.
    functions_timeout
        Seconds ``up`` waits for every function of the stack to have a ready replica.
    shm_dir
        The memory file system the node gateways keep their object stores in
        (``FEDFAAS_SHM_DIR``, default ``/dev/shm``): a tmpfs of its own (``mount -t tmpfs -o
        size=2g tmpfs DIR``) caps the memory the platform's updates may take.
    tls
        Serve HTTPS on the runtime, the node gateways, the cache engine, the request tracker,
        the control plane and the console, with a CA and certificates ``up`` mints; the parts
        call each other over mTLS. On by default: ``fedfaas up --no-tls`` or
        ``FEDFAAS_TLS=false`` serves plain HTTP (this field is the one place that decides).

    Binaries (``minio``, ``redis-server``) are found on PATH or in ``$FEDFAAS_CACHE/bin``
    (see :func:`core.services.find_binary`).
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_", extra="ignore")

    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".state")
    stack_file: Path = Field(default_factory=lambda: Path.cwd() / "stack.yml")
    host: str = "127.0.0.1"
    runtime_port: int | None = None
    minio_port: int | None = None
    minio_console_port: int | None = None
    redis_port: int | None = None
    ports: dict[str, int] = Field(default_factory=dict)
    with_parts: list[str] = Field(default_factory=list)
    start_timeout: float = 60.0
    stop_timeout: float = 40.0
    functions_timeout: float = 60.0
    shm_dir: Path = Path("/dev/shm")
    tls: bool = True

    def port_setting(self, part: str) -> int | None:
        """The configured port of ``part`` (``None`` when unset).

        ``part`` is a port name such as ``"runtime"`` or ``"minio_console"``; parts without a
        field of their own are looked up in :attr:`ports`.
        """
        key = part.replace("-", "_")
        value = getattr(self, f"{key}_port", None) if key in DEFAULT_PORTS else None
        if value is None:
            value = self.ports.get(key, self.ports.get(part))
        return value


def load_settings(**overrides: object) -> PlatformSettings:
    """Read the settings from the environment, then apply ``overrides`` that are not ``None``."""
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = PlatformSettings(**given)  # type: ignore[arg-type]
    settings.state_dir = Path(os.path.abspath(settings.state_dir))
    settings.stack_file = Path(os.path.abspath(settings.stack_file))
    return settings
