"""Basic auth for ``/system/*``, with credentials read from files as OpenFaaS does."""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path

from fedfaas.runtime.errors import Unauthorized

REALM_HEADER = {"WWW-Authenticate": 'Basic realm="Restricted"'}


@dataclass(frozen=True)
class BasicAuth:
    """The one user allowed on ``/system/*``; the password is compared in constant time."""

    user: str
    password: str

    @classmethod
    def from_dir(cls, folder: Path) -> BasicAuth:
        """Read ``basic-auth-user`` and ``basic-auth-password`` (whitespace trimmed)."""
        user = (folder / "basic-auth-user").read_text().strip()
        password = (folder / "basic-auth-password").read_text().strip()
        if not user or not password:
            raise ValueError(f"empty basic-auth-user or basic-auth-password in {folder}")
        return cls(user, password)

    def check(self, header: str | None) -> None:
        """Raise :class:`Unauthorized` unless ``header`` carries these credentials."""
        if not header or not header[:6].lower() == "basic ":
            raise Unauthorized()
        try:
            user, _, password = (
                base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized() from None
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_pass = hmac.compare_digest(password.encode(), self.password.encode())
        if not (ok_user and ok_pass):
            raise Unauthorized()
