"""Which certificate authority the SDK trusts for a platform's ``https://`` URLs.

Every call of the SDK takes ``ca_file``: the platform's CA certificate (``fedfaas up``, TLS by default,
writes it to ``.state/secrets/tls/ca.crt``; ``fedfaas status`` prints its path). With it, the
SDK verifies the server's certificate against that CA only (and the certificate's name against
the URL's host), over TLS 1.2 or newer; without it, httpx's default trust (the system's CAs) is
used. Plain ``http://`` URLs ignore it.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

#: what ``ca_file`` may be: a path (a string or a path-like), or ``None`` for the default trust
CaFile = str | os.PathLike[str] | None


def verify_for(ca_file: CaFile) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for ``ca_file``: a context trusting that CA only, or ``True`` (the
    default trust) without one. A file that does not exist is a :class:`FileNotFoundError`
    naming it, raised before any request."""
    if ca_file is None:
        return True
    path = Path(ca_file)
    if not path.is_file():
        raise FileNotFoundError(f"the platform's CA file {path} does not exist (ca_file)")
    ctx = ssl.create_default_context(cafile=str(path))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
