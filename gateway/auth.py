"""Admin secret, job salts and per-client tokens.

A client's token is ``fedfaas.auth.client_token(secret, job, salt, client)``: HMAC-SHA256 of
``"<job>/<salt>/<client>"`` under the admin secret, in hex. The salt is drawn when the job is
created (:func:`new_salt`) and kept with the job in the journal, so every node gateway that
shares the secret agrees on every token, and a job created again under the same name (a new
salt) refuses the tokens of the one before.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from fedfaas.auth import client_token

__all__ = ["bearer", "check_admin", "client_token", "load_or_create_secret", "new_salt"]


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


def new_salt() -> str:
    """A fresh random salt for a new job (128 bits, hex)."""
    return secrets.token_hex(16)


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def check_admin(secret: str, header: str | None) -> bool:
    tok = bearer(header)
    return tok is not None and hmac.compare_digest(tok, secret)
