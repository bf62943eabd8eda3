"""Admin secret and per-client tokens: HMAC-SHA256(secret, "<job>/<client>") in hex.

Every node gateway that shares the secret agrees on every token, with nothing stored.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path


def load_or_create_secret(path: Path) -> str:
    """Read the admin secret, creating it (mode 0600) on first use."""
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


def client_token(secret: str, job: str, client_id: str) -> str:
    return hmac.new(secret.encode(), f"{job}/{client_id}".encode(), hashlib.sha256).hexdigest()


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def check_admin(secret: str, header: str | None) -> bool:
    tok = bearer(header)
    return tok is not None and hmac.compare_digest(tok, secret)


def check_client(secret: str, job: str, client_id: str, header: str | None) -> bool:
    tok = bearer(header)
    return tok is not None and hmac.compare_digest(tok, client_token(secret, job, client_id))
