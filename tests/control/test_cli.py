"""``python -m control_plane`` as a real process: a bad command line typed by hand, and the one
``ControlPlaneSettings.to_argv`` renders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from control_plane.settings import ControlPlaneSettings
from core.services import free_port, wait_for_port
from tests.commands import run_module
from tests.tokens import auth_header, token_file

ROOT = Path(__file__).resolve().parents[2]


def test_bad_gateways_argument_exits_2_with_a_clear_message():
    r = run_module("control_plane", "--gateways", "node1=ftp://x")
    assert r.returncode == 2
    assert "NAME=http://HOST:PORT" in r.stderr


@pytest.mark.integration
def test_cli_serves_the_api_against_live_gateways(gateways, tmp_path):
    port = free_port()
    spec = ",".join(f"{g.name}={g.url}" for g in gateways)
    log = open(tmp_path / "cp.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        ControlPlaneSettings(
            port=port, gateways=spec, mc=5.0, admin_token_file=token_file(tmp_path)
        ).to_argv(),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        job = {"job": "cli", "rounds": 1, "goal": 3, "clients": 5}
        assert httpx.post(f"{base}/v1/jobs", json=job).status_code == 401
        h = auth_header(tmp_path / "admin-token")
        r = httpx.post(f"{base}/v1/jobs", json=job, headers=h)
        assert r.status_code == 201, r.text
        nodes = httpx.get(f"{base}/v1/nodes", headers=h).json()["nodes"]
        assert [n["name"] for n in nodes] == [g.name for g in gateways]
        a = httpx.get(f"{base}/v1/jobs/cli/assignment", params={"client": "c0"}, headers=h)
        assert a.status_code in (200, 409)
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tracker", "http://127.0.0.1:8092"], "--tracker needs --tracker-token-file"),
        (["--tracker", "127.0.0.1:8092", "--tracker-token-file", "t"], "--tracker: Value error"),
    ],
)
def test_a_tracker_without_its_token_file_or_url_scheme_exits_2_saying_so(flags, says):
    r = run_module("control_plane", "--gateways", "n1=http://127.0.0.1:1", *flags)
    assert r.returncode == 2 and says in r.stderr, r.stderr
