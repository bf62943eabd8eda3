"""Function tokens, the OpenFaaS way: a function checks ``Authorization: Bearer <token>`` against
its secret ``fedfaas-function-token`` (a file in its secrets folder).

Used by the embedded watchdog (:mod:`runtime.watchdog`) and by the Docker template
(``template/python3-http/index.py``); standard library only, since the template installs the
FedFaaS library without its dependencies. Every request but the watchdog's health checks needs
the token; a replica without the secret refuses to start (:func:`load_token`).
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path

#: The OpenFaaS secret holding the token every FedFaaS function requires.
TOKEN_SECRET = "fedfaas-function-token"
#: Environment variable naming the folder of the function's secrets (a path, never a value).
SECRETS_DIR_ENV = "FEDFAAS_SECRETS_DIR"
#: Where OpenFaaS on Kubernetes mounts a function's secrets (used when the variable is unset).
DEFAULT_SECRETS_DIR = "/var/openfaas/secrets"


class NoToken(RuntimeError):
    """The token file is missing, unreadable or empty."""


def token_path(environ: dict[str, str] | None = None) -> Path:
    """``$FEDFAAS_SECRETS_DIR/fedfaas-function-token`` (default folder /var/openfaas/secrets)."""
    env = os.environ if environ is None else environ
    return Path(env.get(SECRETS_DIR_ENV) or DEFAULT_SECRETS_DIR) / TOKEN_SECRET


class FunctionToken:
    """The token in ``path``, re-read when the file changes (secret update or redeploy).

    Parameters
    ----------
    path:
        The secret file (see :func:`token_path`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._value = b""

    def load(self) -> bytes:
        """The current token (whitespace trimmed, as OpenFaaS secrets are read).

        Raises
        ------
        NoToken
            The file is missing, unreadable or empty.
        """
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                value = self.path.read_bytes().strip()
                if not value:
                    raise NoToken(f"the function token file {self.path} is empty")
                self._stamp, self._value = stamp, value
        except OSError as exc:
            raise NoToken(
                f"no function token: cannot read {self.path} ({exc.strerror}). Deploy the "
                f"function with `secrets: [{TOKEN_SECRET}]` (create the secret first: faas-cli "
                f"secret create {TOKEN_SECRET} --from-file TOKEN_FILE); {SECRETS_DIR_ENV} names "
                "the secrets folder"
            ) from None
        return self._value

    def refusal(self, authorization: bytes | None) -> str | None:
        """None when ``authorization`` is ``Bearer <this token>``, else why it is refused.

        Raises
        ------
        NoToken
            The token file went away (the caller answers 503: fail closed).
        """
        token = self.load()
        if not authorization:
            return "send Authorization: Bearer <function token> (the fedfaas-function-token secret)"
        scheme, _, given = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return "the Authorization header must be: Bearer <function token>"
        if not hmac.compare_digest(given.strip(), token):
            return "wrong function token"
        return None


def unauthorized_body(detail: str) -> bytes:
    """The 401 body: ``{"error": "unauthorized", "detail": ...}``."""
    return json.dumps({"error": "unauthorized", "detail": detail}).encode()


def unavailable_body(detail: str) -> bytes:
    """The 503 body when the token file went away: ``{"error": "no_function_token", ...}``."""
    return json.dumps({"error": "no_function_token", "detail": detail}).encode()
