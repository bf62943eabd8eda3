"""Basic auth for ``/system/*``, with credentials read from files as OpenFaaS does.

Always on: the runtime does not start without ``basic-auth-user`` and ``basic-auth-password``
(:meth:`BasicAuth.from_dir`). :meth:`BasicAuth.ensure_dir` makes a random pair, as the OpenFaaS
chart's ``generateBasicAuth`` does, for :class:`~runtime.process.RuntimeProcess`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import Unauthorized

REALM_HEADER = {"WWW-Authenticate": 'Basic realm="Restricted"'}
USER_FILE = "basic-auth-user"
PASSWORD_FILE = "basic-auth-password"


@dataclass(frozen=True)
class BasicAuth:
    """The one user allowed on ``/system/*``; the password is compared in constant time."""

    user: str
    password: str

    @classmethod
    def from_dir(cls, folder: Path) -> BasicAuth:
        """Read ``basic-auth-user`` and ``basic-auth-password`` (whitespace trimmed).

        Raises
        ------
        ValueError
            A file is missing, unreadable or empty; the message names it.
        """
        values = []
        for name in (USER_FILE, PASSWORD_FILE):
            try:
                values.append((folder / name).read_text().strip())
            except OSError as exc:
                raise ValueError(
                    f"the runtime needs basic auth on /system/*: cannot read {folder / name} "
                    f"({exc.strerror}); --auth-dir names the folder with {USER_FILE} and "
                    f"{PASSWORD_FILE}"
                ) from None
        user, password = values
        if not user or not password:
            raise ValueError(f"empty {USER_FILE} or {PASSWORD_FILE} in {folder}")
        return cls(user, password)

    @classmethod
    def ensure_dir(cls, folder: Path) -> BasicAuth:
        """Make ``folder`` (0700) hold the credentials and return them: the files that exist are
        kept, a missing user is ``admin`` and a missing password random (files 0600)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
        for name, value in ((USER_FILE, "admin"), (PASSWORD_FILE, secrets.token_urlsafe(24))):
            try:
                fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(value)
        return cls.from_dir(folder)

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
