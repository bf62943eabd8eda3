"""Basic auth on ``/system/*`` is never off: a runtime without credentials does not start, and
``RuntimeProcess`` always runs one with credentials (random unless written first)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from core.services import free_port
from fedfaas.cli import main
from runtime import RuntimeProcess, create_app
from runtime.settings import RuntimeSettings
from tests.runtime.conftest import STACK, client

pytestmark = pytest.mark.integration


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_runtime_without_an_auth_dir_refuses_to_start(tmp_path: Path) -> None:
    argv = RuntimeSettings(auth_dir=tmp_path, port=free_port(), state_dir=tmp_path).to_argv()
    i = argv.index("--auth-dir")
    without = argv[:i] + argv[i + 2 :]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_RUNTIME_")}
    done = subprocess.run(without, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "--auth-dir" in done.stderr and "required" in done.stderr.lower()
    # a folder without the files: the process exits, naming the file
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert f"cannot read {tmp_path / 'basic-auth-user'}" in done.stderr


def test_the_auth_dir_can_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDFAAS_RUNTIME_AUTH_DIR", str(tmp_path))
    assert RuntimeSettings().auth_dir == tmp_path  # type: ignore[call-arg]


def test_runtime_with_an_auth_dir_lacking_the_files_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="basic-auth-user"):
        create_app(RuntimeSettings(auth_dir=tmp_path, state_dir=tmp_path))
    (tmp_path / "basic-auth-user").write_text("admin")
    with pytest.raises(ValueError, match="basic-auth-password"):
        create_app(RuntimeSettings(auth_dir=tmp_path, state_dir=tmp_path))
    (tmp_path / "basic-auth-password").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        create_app(RuntimeSettings(auth_dir=tmp_path, state_dir=tmp_path))


def test_runtime_process_makes_private_random_credentials_and_system_needs_them(
    runtime: RuntimeProcess,
) -> None:
    assert _mode(runtime.auth_dir) == 0o700
    for name in ("basic-auth-user", "basic-auth-password"):
        assert _mode(runtime.auth_dir / name) == 0o600
    user, password = runtime.auth
    assert user == "admin" and len(password) >= 24
    with httpx.Client(base_url=runtime.url, trust_env=False) as bare:
        r = bare.get("/system/functions")
        assert r.status_code == 401 and r.headers["www-authenticate"] == 'Basic realm="Restricted"'
        assert bare.get("/system/functions", auth=(user, "wrong")).status_code == 401
        assert bare.get("/system/functions", auth=runtime.auth).status_code == 200
        assert bare.get("/healthz").status_code == 200


def test_another_runtime_process_gets_another_password_and_a_restart_keeps_it(
    runtime: RuntimeProcess, tmp_path: Path
) -> None:
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt").start()
    try:
        first = rt.auth
        assert first[1] != runtime.auth[1]
        rt.stop()
        rt.start()
        assert rt.auth == first
        with httpx.Client(base_url=rt.url, trust_env=False) as bare:
            assert bare.get("/system/functions", auth=first).status_code == 200
    finally:
        rt.stop()


def test_fedfaas_deploy_to_a_gateway_needs_its_credentials(
    runtime: RuntimeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["deploy", "-f", str(STACK), "--filter", "echo", "--state-dir", str(tmp_path / "s")]
    assert main([*base, "--gateway", runtime.url]) == 1
    assert "--auth-dir" in capsys.readouterr().err
    assert main([*base, "--gateway", runtime.url, "--auth-dir", str(runtime.auth_dir)]) == 0
    assert "echo" in capsys.readouterr().out
    with client(runtime) as http:
        assert (
            http.request("DELETE", "/system/functions", json={"functionName": "echo"}).status_code
            == 202
        )
