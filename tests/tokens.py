"""Token files for tests of the authenticated services (``core.auth``)."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from core.auth import bearer, write_token_file


def token_file(folder: Path, name: str = "admin-token") -> Path:
    """A fresh random token in ``folder/name`` (0600)."""
    return write_token_file(folder / name, secrets.token_urlsafe(24))


def auth_header(path: Path) -> dict[str, str]:
    """``Authorization: Bearer <the token in path>``."""
    return bearer(path.read_text().strip())


def control_client(coord: Any, secret: str | None = None, **settings: Any) -> TestClient:
    """A test client of the control plane over ``coord``, sending its admin token.

    ``secret`` is the admin token (the gateways' admin secret; random when None).
    """
    from control_plane.api import create_app
    from control_plane.settings import ControlPlaneSettings

    folder = Path(tempfile.mkdtemp())
    admin = write_token_file(folder / "admin-token", secret or secrets.token_urlsafe(24))
    app = create_app(ControlPlaneSettings(admin_token_file=admin, **settings), coord)
    return TestClient(app, headers=auth_header(admin))
