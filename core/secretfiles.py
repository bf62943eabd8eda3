"""Credentials files: how a component gets its MinIO or Redis user, and nothing else.

A credentials file is a JSON object ``{"username": ..., "password": ...}`` in a file of mode
0600 (for MinIO the username is the access key and the password the secret key). Components
take the file's PATH as a setting (``--minio-credentials-file``, ``--redis-credentials-file``)
and read it once at start: a missing, empty or malformed file stops the component there, with
an :class:`~core.auth.AuthConfigError` naming the file. Secrets never travel as command-line
arguments or environment values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.auth import AuthConfigError, read_token_file, write_token_file

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis


@dataclass(frozen=True)
class Credentials:
    """A user name and its password (the password is kept out of ``repr``)."""

    username: str
    password: str = field(repr=False)


def read_credentials(path: Path | None, what: str) -> Credentials:
    """The credentials in ``path``; :class:`AuthConfigError` naming the file otherwise.

    ``what`` says whose they are in the message ("MinIO", "Redis").
    """
    if path is None:
        flag = f"--{what.lower()}-credentials-file"
        raise AuthConfigError(f"no {what} credentials file given ({flag}): it is required")
    text = read_token_file(path, f"{what} credentials")
    try:
        doc: Any = json.loads(text)
    except ValueError:
        doc = None
    if not (
        isinstance(doc, dict)
        and isinstance(doc.get("username"), str)
        and isinstance(doc.get("password"), str)
        and doc["username"]
        and doc["password"]
    ):
        raise AuthConfigError(
            f"the {what} credentials file {path} must hold a JSON object "
            '{"username": "...", "password": "..."} with both set'
        )
    return Credentials(doc["username"], doc["password"])


def write_credentials(path: Path, creds: Credentials) -> Path:
    """Write ``creds`` to ``path`` (mode 0600, replacing the file); return ``path``."""
    return write_token_file(
        path, json.dumps({"username": creds.username, "password": creds.password})
    )


def redis_client(url: str, credentials_file: Path | None, **kw: Any) -> redis.Redis:
    """A Redis client for ``url`` that logs in as the user in ``credentials_file``."""
    import redis

    c = read_credentials(credentials_file, "Redis")
    return redis.Redis.from_url(url, username=c.username, password=c.password, **kw)


def async_redis_client(url: str, credentials_file: Path | None, **kw: Any) -> aioredis.Redis:
    """:func:`redis_client` for ``redis.asyncio``."""
    import redis.asyncio as aioredis

    c = read_credentials(credentials_file, "Redis")
    return aioredis.Redis.from_url(url, username=c.username, password=c.password, **kw)
