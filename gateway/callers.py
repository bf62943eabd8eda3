"""Who calls each route of the node gateway, and the client certificate the internal ones need
over TLS (issue 41: mTLS between the platform's own parts).

Every route but ``/healthz`` needs a bearer credential (:mod:`gateway.api`). Over TLS, the
routes that only the platform's own parts call (*internal*, below) also need a client
certificate the platform's CA signed, presented on the request's connection: a caller that holds
the admin secret but no such certificate (the SDK presents none) is answered 403
``client_certificate_required`` before its body is read (:func:`require_platform_certificate`,
called by :meth:`gateway.core.Gateway.route` before the route's own checks). Both are needed:
the certificate says a part of the platform is calling, the admin secret what it may do.

=======  ==============================================  ==========================================
method   route                                           callers
=======  ==============================================  ==========================================
GET      /healthz                                        anyone (probes, discovery, the control
                                                         plane's health checks): open
GET      /metrics                                        Prometheus, an operator (admin)
GET      /v1/router                                      an operator, the console, ``fedfaas demo``
                                                         (admin)
POST     /v1/jobs                                        the control plane, the SDK's
                                                         ``create_job``, ``fedfaas calibrate``
                                                         (admin)
GET      /v1/jobs                                        an operator (admin)
GET      /v1/jobs/{job}                                  the SDK's clients, the control plane, an
                                                         operator (a client token or admin)
GET      /v1/jobs/{job}/model                            the SDK's clients, peer gateways reading
                                                         the root's model (a client token or admin)
POST     /v1/jobs/{job}/rounds/{number}/updates          the SDK's clients, ``fedfaas calibrate``
                                                         (a client token)
**internal** (over TLS: a platform certificate too)
POST     /v1/internal/jobs/{job}/rounds/{number}/        peer gateways (:mod:`gateway.forward`)
         partials
PUT      /v1/jobs/{job}/rounds/{number}/plan             the control plane
POST     /v1/jobs/{job}/rounds/{number}/close            the control plane
POST     /v1/jobs/{job}/adopt                            the control plane (a node's failover)
GET      /v1/jobs/{job}/rounds/{number}/unmask           the control plane (secure aggregation)
POST     /v1/jobs/{job}/rounds/{number}/unmask           the control plane (secure aggregation)
DELETE   /v1/jobs/{job}                                  the control plane (an operator deletes a
                                                         job on the control plane)
DELETE   /v1/jobs/{job}/clients/{client}                 the control plane (an operator revokes a
                                                         client on the control plane)
=======  ==============================================  ==========================================

The control plane's calls go through :class:`control_plane.gateways.GatewayClient`, which
presents the control plane's certificate when it serves TLS; a gateway's calls to its peers
through its ``peers`` client, which presents the gateway's certificate.

``tls_internal_names`` (a gateway setting) narrows the internal routes to the certificates that
name one of the parts listed (their common name or a DNS name of their subject alternative
names, e.g. ``control-plane,gateway-node0,gateway-node1`` for ``fedfaas up``'s certificates), so a
function replica's certificate (``functions``), which the same CA signs, does not open them
either. Empty (the default): any certificate the CA signed.

Without TLS nothing of this applies (the admin secret alone), nor without a CA
(``tls_ca_file``) or with ``tls_client_certs = "none"``, where the server asks for no
certificate at all (the gateway logs a warning saying so at start).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from gateway.errors import GatewayError
from gateway.exchange import Request

__all__ = [
    "ROUTES",
    "ClientCertificateRequired",
    "RouteCallers",
    "certificate_names",
    "internal_route",
    "parse_names",
    "require_platform_certificate",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouteCallers:
    """One route (a FastAPI path template), who calls it, and whether it is internal."""

    method: str
    path: str
    callers: str
    internal: bool = False

    def matches(self, method: str, path: str) -> bool:
        """``method path`` (the path decoded, as the app routes it) is this route."""
        same = method == self.method or (method == "HEAD" and self.method == "GET")
        return same and _pattern(self.path).fullmatch(path) is not None


def _pattern(template: str) -> re.Pattern[str]:
    found = _PATTERNS.get(template)
    if found is None:
        # a path parameter matches one segment, as FastAPI's default (str) converter
        found = _PATTERNS[template] = re.compile(
            re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template))
        )
    return found


_PATTERNS: dict[str, re.Pattern[str]] = {}

PEERS = "peer gateways (gateway.forward)"
CONTROL_PLANE = "the control plane (control_plane.gateways)"

#: every route of the gateway (tests/tls/test_internal_routes.py checks this is the app's table
#: plus the native routes, so a new route must be placed here)
ROUTES: tuple[RouteCallers, ...] = (
    RouteCallers("GET", "/healthz", "anyone: probes, discovery, health checks"),
    RouteCallers("GET", "/metrics", "Prometheus, an operator"),
    RouteCallers("GET", "/v1/router", "an operator, the console, fedfaas demo"),
    RouteCallers("POST", "/v1/jobs", "the control plane, the SDK's create_job, fedfaas calibrate"),
    RouteCallers("GET", "/v1/jobs", "an operator"),
    RouteCallers("GET", "/v1/jobs/{job}", "the SDK's clients, the control plane, an operator"),
    RouteCallers("GET", "/v1/jobs/{job}/model", "the SDK's clients, peer gateways"),
    RouteCallers("POST", "/v1/jobs/{job}/rounds/{number}/updates", "the SDK's clients"),
    RouteCallers("POST", "/v1/internal/jobs/{job}/rounds/{number}/partials", PEERS, True),
    RouteCallers("PUT", "/v1/jobs/{job}/rounds/{number}/plan", CONTROL_PLANE, True),
    RouteCallers("POST", "/v1/jobs/{job}/rounds/{number}/close", CONTROL_PLANE, True),
    RouteCallers("POST", "/v1/jobs/{job}/adopt", CONTROL_PLANE, True),
    RouteCallers("GET", "/v1/jobs/{job}/rounds/{number}/unmask", CONTROL_PLANE, True),
    RouteCallers("POST", "/v1/jobs/{job}/rounds/{number}/unmask", CONTROL_PLANE, True),
    RouteCallers("DELETE", "/v1/jobs/{job}", CONTROL_PLANE, True),
    RouteCallers("DELETE", "/v1/jobs/{job}/clients/{client}", CONTROL_PLANE, True),
)

INTERNAL = tuple(r for r in ROUTES if r.internal)


class ClientCertificateRequired(GatewayError):
    """403: an internal route called without a platform client certificate."""

    status = 403
    code = "client_certificate_required"


def internal_route(method: str, path: str) -> RouteCallers | None:
    """The internal route ``method path`` is (``path`` as received: it is decoded here, as the
    app decodes it before routing), or ``None``."""
    decoded = unquote(path)
    return next((r for r in INTERNAL if r.matches(method, decoded)), None)


def parse_names(text: str) -> frozenset[str]:
    """``"a, b,c"`` -> ``{"a", "b", "c"}`` (the ``tls_internal_names`` setting)."""
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def certificate_names(cert: Mapping[str, Any]) -> set[str]:
    """A verified certificate's names (:meth:`ssl.SSLSocket.getpeercert`'s dict): its common
    name and the DNS names of its subject alternative names."""
    names = {
        value
        for rdn in cert.get("subject", ())
        for key, value in rdn
        if key == "commonName" and isinstance(value, str)
    }
    names |= {v for k, v in cert.get("subjectAltName", ()) if k == "DNS" and isinstance(v, str)}
    return names


def require_platform_certificate(req: Request, allowed: Collection[str] = ()) -> None:
    """Refuse (403 :class:`ClientCertificateRequired`, logged) an internal route on a TLS
    connection whose client presented no certificate (or, with ``allowed``, one naming none of
    those parts). A certificate on ``req`` is one the platform's CA verified in the handshake.
    Does nothing for a plain-HTTP request or any other route."""
    if not req.tls:
        return
    route = internal_route(req.method, req.path)
    if route is None:
        return
    who = f"{req.peer[0]}:{req.peer[1]}" if req.peer else "a client"
    if not req.client_cert:
        log.warning(
            "refused %s %s from %s: no client certificate (an internal route: %s)",
            req.method,
            req.path,
            who,
            route.callers,
        )
        raise ClientCertificateRequired(
            f"{req.method} {route.path} is called by {route.callers} only: present the "
            f"part's client certificate (signed by the platform's CA) as well as the admin "
            f"bearer token"
        )
    if allowed:
        names = certificate_names(req.client_cert)
        if not names & set(allowed):
            log.warning(
                "refused %s %s from %s: client certificate names %s, none of %s "
                "(tls_internal_names)",
                req.method,
                req.path,
                who,
                sorted(names),
                sorted(allowed),
            )
            raise ClientCertificateRequired(
                f"{req.method} {route.path} is called by {route.callers} only: the client "
                f"certificate names {sorted(names)}, none of the parts this gateway lets in "
                f"(tls_internal_names: {sorted(allowed)})"
            )
