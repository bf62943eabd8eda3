"""The Docker template's server (template/python3-http/index.py) checks the function token as the
embedded watchdog does. waitress (only its ``serve`` is used, under ``__main__``) is not needed
here: a stand-in module lets index.py import; the Flask app itself is the real one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.conftest import REPO

TEMPLATE = REPO / "template" / "python3-http"
TOKEN = "template-token-value"

pytest.importorskip("flask")


def _waitress_stub(folder: Path) -> Path:
    (folder / "waitress.py").write_text("def serve(*args, **kwargs):\n    raise SystemExit(0)\n")
    return folder


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "fedfaas-function-token").write_text(TOKEN + "\n")
    monkeypatch.setenv("FEDFAAS_SECRETS_DIR", str(secrets))
    monkeypatch.setitem(sys.modules, "waitress", types.ModuleType("waitress"))
    sys.modules["waitress"].serve = lambda *a, **k: None  # type: ignore[attr-defined]
    monkeypatch.syspath_prepend(str(TEMPLATE))
    for name in ("function", "function.handler"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("template_index", TEMPLATE / "index.py")
    assert spec and spec.loader
    index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(index)
    index.app.config["TESTING"] = True
    yield index.app, secrets
    for name in ("function", "function.handler"):
        sys.modules.pop(name, None)


def test_template_requires_the_function_token(app: tuple) -> None:  # type: ignore[type-arg]
    flask_app, secrets = app
    client = flask_app.test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = client.post("/", data=b"x" * 100_000, headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert r.get_json()["error"] == "unauthorized" and r.get_json()["detail"]
    r = client.post("/any/path", data=b"\x00body", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.data == b"\x00body"
    (secrets / "fedfaas-function-token").unlink()  # the secret went away: fail closed
    r = client.post("/", data=b"x", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503 and r.get_json()["error"] == "no_function_token"


def test_template_refuses_to_start_without_the_token(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FEDFAAS_SECRETS_DIR": str(tmp_path / "empty"),
        "PYTHONPATH": os.pathsep.join([str(_waitress_stub(tmp_path)), str(TEMPLATE), str(REPO)]),
    }
    out = subprocess.run(
        [sys.executable, "index.py"],
        cwd=TEMPLATE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "refusing to start" in out.stderr and "fedfaas-function-token" in out.stderr
