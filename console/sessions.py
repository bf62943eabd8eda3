"""Logins of the console: a token in, an HttpOnly SameSite=Strict cookie out.

A person logs in with the platform's admin token or the analyst token (the same ones the JSON
APIs take, :mod:`core.auth`). The console keeps the session on its side: the cookie holds a
random session id only, never the token, and no page or link ever carries a token in its URL.
Each session has a CSRF token, given to the page in a ``<meta>`` tag; every request that is
not a read (POST, DELETE) must send it back in ``X-CSRF-Token``, checked before its body is
read. Pages and the console's JSON answer with the scopes of the JSON APIs: the analyst reads,
the admin also changes state.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from fastapi import Request

from core.auth import AuthError, Scope

#: the session cookie's name
COOKIE = "fedfaas_console"
#: the header that carries the session's CSRF token on state changes
CSRF_HEADER = "X-CSRF-Token"
#: methods that only read (no CSRF token needed)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: sessions one console keeps at most (the oldest go first): a flood of logins cannot grow it
MAX_SESSIONS = 1000


class LoginRequired(AuthError):
    """No session (or an expired one): a page redirects to the login, JSON answers 401."""

    def __init__(self, detail: str) -> None:
        super().__init__(401, detail)


class CsrfRefused(AuthError):
    """A state change without its session's CSRF token: 403."""

    def __init__(self) -> None:
        super().__init__(403, f"a state change needs the page's CSRF token in {CSRF_HEADER}")


@dataclass
class Session:
    """One login: its scope, the token it logged in with (used for the admin's own calls),
    its CSRF token and when it ends."""

    scope: Scope
    token: str
    expires: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))


@dataclass
class Sessions:
    """The console's logins, in memory (a restart logs everyone out)."""

    ttl_s: float
    by_id: dict[str, Session] = field(default_factory=dict)

    def open(self, scope: Scope, token: str) -> tuple[str, Session]:
        """A new session of ``scope``: its id (the cookie's value) and the session."""
        now = time.monotonic()
        for sid in [s for s, v in self.by_id.items() if v.expires <= now]:
            del self.by_id[sid]
        while len(self.by_id) >= MAX_SESSIONS:
            del self.by_id[next(iter(self.by_id))]
        sid = secrets.token_urlsafe(32)
        session = Session(scope, token, now + self.ttl_s)
        self.by_id[sid] = session
        return sid, session

    def find(self, sid: str | None) -> Session | None:
        """The live session of cookie value ``sid``, or None."""
        if not sid:
            return None
        session = self.by_id.get(sid)
        if session is None or session.expires <= time.monotonic():
            self.by_id.pop(sid, None)
            return None
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            self.by_id.pop(sid, None)


@dataclass(frozen=True)
class require_session:  # noqa: N801 - used like a function, as core.auth.require
    """A FastAPI dependency: a live session of one of ``scopes`` (admin always admitted) and,
    on a state change, its CSRF token. Answers the :class:`Session`.

    A bearer token is no login here: the console's pages and JSON take the cookie only (the
    services' own APIs take the bearer token).
    """

    scopes: frozenset[Scope]

    def __init__(self, *scopes: Scope) -> None:
        object.__setattr__(self, "scopes", frozenset(scopes) | {Scope.ADMIN})

    async def __call__(self, request: Request) -> Session:
        sessions: Sessions = request.app.state.sessions
        session = sessions.find(request.cookies.get(COOKIE))
        if session is None:
            raise LoginRequired("log in first (POST /login with the admin or analyst token)")
        if session.scope not in self.scopes:
            allowed = ", ".join(sorted(self.scopes))
            raise AuthError(403, f"a {session.scope} login may not do this (allowed: {allowed})")
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
                raise CsrfRefused()
        return session
