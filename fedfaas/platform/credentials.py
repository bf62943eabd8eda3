"""Secrets of one platform, as files (mode 0600) in ``STATE_DIR/secrets``.

Like the OpenFaaS chart's ``generateBasicAuth``: the user is ``admin`` and the password is
random, written once as ``basic-auth-user`` / ``basic-auth-password`` (the names the gateway
reads from its ``secret_mount_path``). MinIO's root credentials are generated the same way.
The components' MinIO and Redis users (``minio-<user>.json``, ``redis-<user>.json``) are made
by :class:`core.services.MinioServer` and :class:`core.services.RedisServer` when the
platform prepares them; each part is given the path of its own files only.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

BASIC_AUTH_USER = "basic-auth-user"
BASIC_AUTH_PASSWORD = "basic-auth-password"
MINIO_USER = "minio-root-user"
MINIO_PASSWORD = "minio-root-password"
#: bearer tokens of the FastAPI services (``core.auth``): the admin scope of the cache engine
#: and the tracker (the control plane's admin token is the gateways' admin secret), the
#: read-only analyst scope (tracker queries, control-plane reads), the service scope (tracker
#: and gateways -> cache engine)
ADMIN_TOKEN = "admin-token"
ANALYST_TOKEN = "analyst-token"
SERVICE_TOKEN = "service-token"
#: the function token: every function requires it (``Authorization: Bearer``); ``fedfaas up``
#: stores it in the runtime as the OpenFaaS secret ``fedfaas-function-token``
FUNCTION_TOKEN = "function-token"


def _write_once(path: Path, value: str) -> str:
    """Write ``value`` to ``path`` (mode 0600) unless it exists; return the file's value."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return value


def ensure(secrets_dir: Path) -> None:
    """Create the secrets folder (0700) and every secret that does not exist yet."""
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(secrets_dir, 0o700)
    _write_once(secrets_dir / BASIC_AUTH_USER, "admin")
    _write_once(secrets_dir / BASIC_AUTH_PASSWORD, secrets.token_urlsafe(24))
    _write_once(secrets_dir / MINIO_USER, "fedfaas")
    _write_once(secrets_dir / MINIO_PASSWORD, secrets.token_urlsafe(24))
    for name in (ADMIN_TOKEN, ANALYST_TOKEN, SERVICE_TOKEN, FUNCTION_TOKEN):
        _write_once(secrets_dir / name, secrets.token_urlsafe(32))


def read(secrets_dir: Path, name: str) -> str:
    """The value of secret ``name``, whitespace trimmed (as OpenFaaS reads them)."""
    return (secrets_dir / name).read_text().strip()


def basic_auth(secrets_dir: Path) -> tuple[str, str]:
    """``(user, password)`` for the runtime's ``/system/*`` routes."""
    return read(secrets_dir, BASIC_AUTH_USER), read(secrets_dir, BASIC_AUTH_PASSWORD)
