"""deploy/faasd without faasd: the compose file's settings as the components read them, the
secrets prepare.py writes (files, each service only its own), and wait-for.py. Fast; the
platform itself runs in test_faasd_platform.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from gateway.settings import GatewaySettings
from request_tracker.settings import TrackerSettings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "faasd"
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())["services"]
#: FedFaaS's compose services run by a settings class, and that class
SETTINGS = {
    "gateway-node0": GatewaySettings,
    "gateway-node1": GatewaySettings,
    "cache-engine": EngineSettings,
    "request-tracker": TrackerSettings,
    "control-plane": ControlPlaneSettings,
}
FEDFAAS = [*SETTINGS, "minio", "minio-provision", "redis", "aggregator-node0", "aggregator-node1"]


def _env(service: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in COMPOSE[service].get("environment", []))


def _app_version() -> str:
    text = (REPO / "charts" / "fedfaas" / "Chart.yaml").read_text()
    found = re.search(r'^appVersion:\s*"?([^"\s]+)"?', text, re.M)
    assert found, "no appVersion in Chart.yaml"
    return found.group(1)


@pytest.mark.parametrize("service", sorted(SETTINGS))
def test_each_service_env_is_a_setting_of_its_component(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every FEDFAAS_* variable the compose file gives a service names a field of the
    component's settings class, and the class reads the value given (a typo would be ignored
    silently by the component)."""
    cls = SETTINGS[service]
    prefix = cls.model_config["env_prefix"]
    env = _env(service)
    for name in [k for k in os.environ if k.startswith("FEDFAAS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        assert name.startswith(prefix), name
        assert name[len(prefix) :].lower() in cls.model_fields, f"{service}: {name} is no setting"
        monkeypatch.setenv(name, value)
    settings = cls()
    for name, value in env.items():
        got: Any = getattr(settings, name[len(prefix) :].lower())
        if isinstance(got, dict):
            assert got == json.loads(value), name
        elif isinstance(got, bool):
            assert got == (value == "true"), name
        elif isinstance(got, int | float):
            assert got == type(got)(value), name
        else:
            assert str(got if got is not None else "") == value, name


def test_secrets_reach_services_as_paths_in_a_read_only_folder_never_as_values() -> None:
    for service in FEDFAAS:
        for name, value in _env(service).items():
            if re.search(r"TOKEN|SECRET|PASSWORD|CREDENTIALS|AUTH", name):
                assert re.search(r"_(FILE|DIR)$", name), f"{service}: {name} holds a value"
                assert value.startswith("/var/secrets"), f"{service}: {name}={value}"
        mounts = {v["target"]: v for v in COMPOSE[service].get("volumes", [])}
        for target in ("/var/secrets", "/var/openfaas/secrets"):
            if target in mounts:
                assert mounts[target].get("read_only") is True, (service, target)


def test_fedfaas_services_run_as_uid_12000_from_images_of_this_version() -> None:
    tag = _app_version()
    for service in FEDFAAS:
        assert COMPOSE[service]["user"] == "12000", service  # numeric: faasd chowns its folders
        assert COMPOSE[service]["image"].endswith(f":{tag}"), service
    # each aggregator shares its node gateway's store and socket folders
    for node in ("node0", "node1"):
        gw = {v["target"]: v["source"] for v in COMPOSE[f"gateway-{node}"]["volumes"]}
        agg = {v["target"]: v["source"] for v in COMPOSE[f"aggregator-{node}"]["volumes"]}
        for target in ("/dev/shm/fedfaas", "/run/fedfaas"):
            assert gw[target] == agg[target], (node, target)
        assert (
            _env(f"aggregator-{node}")["FEDFAAS_GATEWAY_ROUTER_SOCKET"]
            == _env(f"gateway-{node}")["FEDFAAS_GATEWAY_ROUTER_SOCKET"]
        )


def _prepare(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "prepare.py"), *args, str(workdir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="prepare.py hands files to uid 12000: needs root")
def test_prepare_gives_each_service_only_its_own_secret_files_and_keeps_them(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(DEPLOY))
    try:
        import prepare
    finally:
        sys.path.remove(str(DEPLOY))
    out = _prepare(tmp_path)
    assert out.returncode == 0, out.stderr
    secrets = tmp_path / "fedfaas" / "secrets"
    platform = secrets / "platform"
    assert platform.stat().st_mode & 0o777 == 0o700
    for service, files in prepare.SERVICE_SECRETS.items():
        folder = secrets / service
        held = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        assert held == set(files), service
        for inside, name in files.items():
            st = (folder / inside).stat()
            assert (st.st_uid, st.st_mode & 0o777) == (12000, 0o400), (service, inside)
            assert (folder / inside).read_bytes() == (platform / name).read_bytes()
    # every mounted folder of the compose file exists for its service
    for service in FEDFAAS:
        for v in COMPOSE[service].get("volumes", []):
            src = v["source"]
            if src.startswith("./fedfaas/"):
                assert (tmp_path / src).exists(), (service, src)
    conf = (tmp_path / "fedfaas" / "redis" / "redis.conf").read_text()
    assert 'dir "/data"' in conf  # the container's folder (docker-compose.yaml's mount)
    for user in ("gateway", "cache-engine", "request-tracker", "control-plane"):
        password = json.loads((platform / f"redis-{user}.json").read_text())["password"]
        assert password not in conf and f"user {user} on #" in conf
    before = {p.name: p.read_bytes() for p in platform.iterdir()}
    assert _prepare(tmp_path).returncode == 0
    assert {p.name: p.read_bytes() for p in platform.iterdir()} == before  # kept, not remade
    # faasd's basic auth is the platform's
    assert (tmp_path / "secrets" / "basic-auth-password").read_bytes() == before[
        "basic-auth-password"
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="prepare.py hands files to uid 12000: needs root")
def test_prepare_without_async_drops_nats_and_the_queue_worker(tmp_path: Path) -> None:
    assert _prepare(tmp_path, "--no-async").returncode == 0
    services = yaml.safe_load((tmp_path / "docker-compose.yaml").read_text())["services"]
    assert "nats" not in services and "queue-worker" not in services
    assert not [e for e in services["gateway"]["environment"] if e.startswith("faas_nats")]
    assert "nats" not in services["gateway"]["depends_on"]
    assert set(services) >= set(FEDFAAS)


def _wait_for(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "wait-for.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_wait_for_runs_the_command_once_the_server_answers() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _wait_for(f"127.0.0.1:{port}", "--", sys.executable, "-c", "print('started')")
    assert (out.returncode, out.stdout) == (0, "started\n")


def test_wait_for_gives_up_naming_what_did_not_answer() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _wait_for("--timeout", "1", f"127.0.0.1:{port}", "--", "true")
    assert out.returncode == 1
    assert f"127.0.0.1:{port} not answering" in out.stderr
    assert _wait_for("nohost", "--", "true").returncode == 2  # not HOST:PORT
