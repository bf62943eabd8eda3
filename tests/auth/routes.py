"""The route walk that the credential tests share: each route of an app, by method and path, and
the guard dependency (``require(...)``, ``require_session(...)``) that it must carry."""

from __future__ import annotations

from typing import TypeVar

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

#: the "method" of a route that takes any (a mount, a websocket route)
ANY = "*"

G = TypeVar("G")


def methods(route: BaseRoute) -> list[str]:
    """The route's methods (:data:`ANY` for a route that takes any)."""
    return sorted(getattr(route, "methods", None) or {ANY})


def route_of(app: FastAPI, method: str, path: str) -> BaseRoute:
    """The route of ``app`` that serves ``method`` on ``path``."""
    return next(
        r for r in app.routes if getattr(r, "path", repr(r)) == path and method in methods(r)
    )


def guard_of(route: BaseRoute, kind: type[G]) -> G:
    """The dependency of type ``kind`` that guards ``route``; AssertionError where there is
    none, or where the route is no ``APIRoute`` (nothing could guard it)."""
    where = f"{methods(route)} {getattr(route, 'path', route)!r}"
    assert isinstance(route, APIRoute), f"{where} is a {type(route).__name__}: nothing guards it"
    for dep in route.dependant.dependencies:
        if isinstance(dep.call, kind):
            return dep.call
    raise AssertionError(f"{where} has no {kind.__name__}(...) dependency")
