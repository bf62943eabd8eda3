"""How the locust users trust ``fedfaas up``'s parts over TLS, its default: the platform's CA
certificate (``secrets/tls/ca.crt`` of its state folder), named by an environment variable of
the locustfile or found in the secrets folder it already reads. No locust here (the tests
import it without one).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

#: where ``fedfaas up`` writes its CA certificate, under the platform's secrets folder
CA_IN_SECRETS = Path("tls") / "ca.crt"


def ca_file(named: str, secrets: Path) -> str:
    """The CA certificate the users verify the parts against: ``named`` (an environment
    variable's value) when given, which must then exist; else ``secrets/tls/ca.crt`` where
    there is one; else ``""`` (the system's CAs, or ``REQUESTS_CA_BUNDLE``: a plain-HTTP
    platform, or one whose parts have publicly trusted certificates)."""
    if named:
        if not Path(named).is_file():
            raise FileNotFoundError(f"the CA certificate {named} does not exist")
        return named
    found = secrets / CA_IN_SECRETS
    return str(found) if found.is_file() else ""


def trust(session: Any, ca: str) -> None:
    """Make a locust user's session (a ``requests.Session``) verify ``https://`` servers
    against ``ca`` (nothing to do without one). The session's environment is ignored then:
    ``requests`` lets ``REQUESTS_CA_BUNDLE`` override a session's own ``verify``."""
    if ca:
        session.verify = ca
        session.trust_env = False


#: the certificate and key ``fedfaas`` itself presents to the parts (``fedfaas status``'s),
#: under the secrets folder
OWN_CERT = (Path("tls") / "fedfaas.crt", Path("tls") / "fedfaas.key")


def platform_client(ca: str, secrets: Path) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for a call to a part that requires a platform certificate (the cache
    engine, over TLS): ``ca`` trusted, and ``fedfaas``'s own certificate presented where the
    secrets folder holds it (:data:`OWN_CERT`); ``True`` without a CA."""
    from core.tls import TlsFiles, client_context

    if not ca:
        return True
    cert, key = (secrets / p for p in OWN_CERT)
    if cert.is_file() and key.is_file():
        return TlsFiles(cert, key, Path(ca)).client_context()
    return client_context(Path(ca))
