"""One authentication layer for the FastAPI services (control plane, cache engine, tracker).

Credentials are bearer tokens read from secret files (as OpenFaaS secrets are), never from argv
or environment values. Four scopes:

* ``admin``: the platform's admin token file; allowed on every route.
* ``service``: service-to-service calls (tracker and gateways -> cache engine).
* ``analyst``: read-only queries (tracker queries, control-plane reads).
* ``client``: one client of one job; its token is :func:`client_token` of the admin secret, the
  job, the job's salt and the client, checked on routes that name the job (path ``{job}``) and
  the client (``?client=``).
* ``enroll``: one job's enrollment token (:func:`enrollment_token`), which its owner hands to
  clients to enroll with; checked on routes that name the job. The salt is drawn at random when the job is created (by its root
  node gateway), so a job deleted and created again under the same name refuses the old
  tokens; a service admits client tokens only when it can look a job's salt up
  (``Authenticator.job_salt``).

Use::

    auth = Authenticator.from_files(admin=..., analyst=..., service=...)
    install(app, auth)
    @app.get("/v1/x", dependencies=[require(Scope.ANALYST)])

A missing credential or one no scope knows answers 401 (``WWW-Authenticate: Bearer``); a valid
credential of a scope the route does not allow answers 403. Both with ``{"error", "detail"}``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)


class Scope(StrEnum):
    """What a credential may do."""

    ADMIN = "admin"
    SERVICE = "service"
    ANALYST = "analyst"
    CLIENT = "client"
    ENROLL = "enroll"


class AuthConfigError(RuntimeError):
    """A token file is missing, empty or unreadable (raised at start, never per request)."""


class AuthError(Exception):
    """A request without an acceptable credential; the HTTP layer answers 401 or 403."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def read_token_file(path: Path, what: str = "token") -> str:
    """The token in ``path``, whitespace trimmed; a clear :class:`AuthConfigError` otherwise.

    A file others may read, or group or others may write, is logged as a warning (0600, or
    0440 as Kubernetes mounts a Secret for a pod's ``fsGroup``).
    """
    try:
        st = path.stat()
        value = path.read_text().strip()
    except OSError as exc:
        raise AuthConfigError(f"cannot read the {what} file {path}: {exc}") from exc
    if not value:
        raise AuthConfigError(f"the {what} file {path} is empty: write a random token to it")
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o027:
        log.warning("%s file %s has mode %o; it should be 0600", what, path, st.st_mode & 0o777)
    return value


def write_token_file(path: Path, value: str) -> Path:
    """Write ``value`` to ``path`` with mode 0600 (replacing the file); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.chmod(path, 0o600)
    return path


def client_token(secret: str, job: str, salt: str, client_id: str) -> str:
    """HMAC-SHA256(secret, ``job/salt/client``) hex: the token of one client of one job.

    ``salt`` is the job's, drawn when it was created (its creation answer carries the tokens;
    nobody needs to call this but the services that check them).
    """
    msg = f"{job}/{salt}/{client_id}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def enrollment_token(secret: str, job: str, salt: str) -> str:
    """The token with which clients enroll in one incarnation of ``job`` (its owner hands it
    out); never any client's token (another message), and refused after the job is created
    again (another salt)."""
    msg = f"enroll/{job}/{salt}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header carrying ``token``."""
    return {"Authorization": f"Bearer {token}"}


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header value; None for anything else."""
    kind, _, token = (header or "").partition(" ")
    return token.strip() if kind.lower() == "bearer" and token.strip() else None


@dataclass(frozen=True)
class Authenticator:
    """The tokens one service accepts, by scope. The admin token also signs client tokens.

    ``job_salt`` (job name -> its salt, or None for a job the service does not know) lets the
    service admit client tokens; without it the client scope accepts nobody.
    """

    tokens: dict[Scope, str] = field(default_factory=dict)
    job_salt: Callable[[str], str | None] | None = None

    @classmethod
    def from_files(
        cls,
        admin: Path | None,
        analyst: Path | None = None,
        service: Path | None = None,
    ) -> Authenticator:
        """Read the token files; the admin one is required (a service nobody can manage is a
        misconfiguration), the others optional (their scope then accepts nobody)."""
        if admin is None:
            raise AuthConfigError(
                "no admin token file: pass --admin-token-file PATH (a 0600 file holding a "
                "random token; the platform writes one in its secrets folder)"
            )
        tokens = {Scope.ADMIN: read_token_file(admin, "admin token")}
        if analyst is not None:
            tokens[Scope.ANALYST] = read_token_file(analyst, "analyst token")
        if service is not None:
            tokens[Scope.SERVICE] = read_token_file(service, "service token")
        return cls(tokens)

    @property
    def scopes(self) -> frozenset[Scope]:
        """Scopes this service can recognise (client when it can look up jobs' salts)."""
        client = (
            {Scope.CLIENT, Scope.ENROLL}
            if self.job_salt is not None and Scope.ADMIN in self.tokens
            else set()
        )
        return frozenset(self.tokens) | client

    def scope_of(self, token: str, request: Request) -> Scope | None:
        """The scope ``token`` proves for ``request``, or None. Every comparison is constant-time."""
        found = None
        for scope, value in self.tokens.items():
            if hmac.compare_digest(token.encode(), value.encode()):
                found = scope
        job = request.path_params.get("job")
        client = request.query_params.get("client")
        lookup = self.job_salt
        if found is None and job and lookup is not None and Scope.ADMIN in self.tokens:
            salt = lookup(str(job))
            if salt is not None:
                admin = self.tokens[Scope.ADMIN]
                if client and hmac.compare_digest(
                    token.encode(), client_token(admin, str(job), salt, client).encode()
                ):
                    found = Scope.CLIENT
                elif hmac.compare_digest(
                    token.encode(), enrollment_token(admin, str(job), salt).encode()
                ):
                    found = Scope.ENROLL
        return found


@dataclass(frozen=True)
class require:  # noqa: N801 - used like a function: ``dependencies=[require(Scope.ANALYST)]``
    """A FastAPI dependency admitting the given scopes (admin always admitted)."""

    scopes: frozenset[Scope]

    def __init__(self, *scopes: Scope) -> None:
        object.__setattr__(self, "scopes", frozenset(scopes) | {Scope.ADMIN})

    async def __call__(self, request: Request) -> Scope:
        auth: Authenticator = request.app.state.auth
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise AuthError(401, "send 'Authorization: Bearer TOKEN' (the token from its file)")
        scope = auth.scope_of(token, request)
        if scope is None:
            raise AuthError(401, "the bearer token is not valid for this service")
        if scope not in self.scopes:
            allowed = ", ".join(sorted(self.scopes))
            raise AuthError(403, f"a {scope} credential may not do this (allowed: {allowed})")
        return scope


def private_app(title: str, **kwargs: Any) -> FastAPI:
    """A FastAPI app without ``/docs``, ``/redoc`` and ``/openapi.json``: every FedFaaS API
    route but ``/healthz`` needs a credential, and FastAPI would serve those three to anyone
    (``tests/auth`` walks every service's routes). ``kwargs`` go to :class:`FastAPI`."""
    return FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None, **kwargs)


def install(app: FastAPI, auth: Authenticator) -> None:
    """Attach ``auth`` to ``app`` and answer :class:`AuthError` as 401/403 JSON."""
    app.state.auth = auth

    @app.exception_handler(AuthError)
    async def auth_error(request: Request, exc: AuthError) -> JSONResponse:
        error = "unauthorized" if exc.status == 401 else "forbidden"
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": error, "detail": exc.detail}, status_code=exc.status, headers=headers
        )
