"""Admin secret, job salts and per-client tokens.

A client's token is ``core.auth.client_token(secret, job, salt, client)``: HMAC-SHA256 of
``"<job>/<salt>/<client>"`` under the admin secret, in hex. The salt is drawn when the job is
created (:func:`new_salt`) and kept with the job in the journal, so every node gateway that
shares the secret agrees on every token, and a job created again under the same name (a new
salt) refuses the tokens of the one before.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from core.auth import bearer_token, client_token, write_token_file

__all__ = ["bearer_token", "check_admin", "client_token", "load_or_create_secret", "new_salt"]


def load_or_create_secret(path: Path) -> str:
    """Read the admin secret, creating it (mode 0600) on first use."""
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = secrets.token_hex(32)
    write_token_file(path, value + "\n")
    return value


def new_salt() -> str:
    """A fresh random salt for a new job (128 bits, hex)."""
    return secrets.token_hex(16)


def check_admin(secret: str, header: str | None) -> bool:
    tok = bearer_token(header)
    return tok is not None and hmac.compare_digest(tok, secret)
