"""``fedfaas up --with console``: the part's command line, from ``ConsoleSettings.to_argv``."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.settings import ConsoleSettings
from fedfaas.platform import credentials, optional
from fedfaas.platform.context import Context

PORTS = {
    "runtime": 1001,
    "minio": 1002,
    "minio_console": 1003,
    "redis": 1004,
    "gateway": 1005,
    "gateway_node1": 1006,
    "cache_engine": 1007,
    "control_plane": 1008,
    "request_tracker": 1009,
    "console": 1010,
}


def test_the_console_part_points_at_the_platforms_services_and_secret_files(
    tmp_path: Path,
) -> None:
    ctx = Context(tmp_path, "127.0.0.1", tmp_path / "stack.yml", "ab" * 16, dict(PORTS))
    credentials.ensure(ctx.secrets_dir)
    argv = optional.CONSOLE.argv(ctx)
    assert argv[1:3] == ["-m", "console"]
    s, _ = ConsoleSettings.from_argv(argv[3:])
    assert (s.host, s.port) == ("127.0.0.1", 1010)
    assert s.control_plane_url == "http://127.0.0.1:1008"
    assert s.tracker_url == "http://127.0.0.1:1009"
    assert s.runtime_url == "http://127.0.0.1:1001"
    assert s.gateway_map() == {"node0": "http://127.0.0.1:1005", "node1": "http://127.0.0.1:1006"}
    assert (s.minio_endpoint, s.minio_console_url) == ("127.0.0.1:1002", "http://127.0.0.1:1003")
    # secrets as paths of the platform's files: the admin's, the analyst's, a read-only MinIO user
    assert s.admin_token_file == optional.admin_secret(ctx)
    assert s.analyst_token_file == ctx.secrets_dir / credentials.ANALYST_TOKEN
    assert s.minio_credentials_file == ctx.secrets_dir / "minio-cache-engine.json"
    assert optional.CONSOLE.env(ctx) == {}
    assert optional.CONSOLE.address(ctx) == "http://127.0.0.1:1010"
    assert "console" in optional.OPTIONAL
    assert optional.CONSOLE in optional.resolve(["all"])
    assert {"control-plane", "request-tracker"} <= {p.name for p in optional.resolve(["console"])}


def _ctx(tmp_path: Path, **ports: int) -> Context:
    ctx = Context(tmp_path, "127.0.0.1", tmp_path / "stack.yml", "ab" * 16, PORTS | ports)
    credentials.ensure(ctx.secrets_dir)
    return ctx


def _prometheus_flag(ctx: Context) -> str:
    s, _ = ConsoleSettings.from_argv(optional.CONSOLE.argv(ctx)[3:])
    return s.prometheus_url


def test_the_console_takes_its_rates_from_the_platforms_prometheus_when_it_runs_one(
    tmp_path: Path,
) -> None:
    assert _prometheus_flag(_ctx(tmp_path)) == ""  # none: the console's own rates
    ctx = _ctx(tmp_path, prometheus=1011)
    assert _prometheus_flag(ctx) == "http://127.0.0.1:1011"
    # it scrapes both node gateways with the admin secret, read from its file at each scrape
    optional.PROMETHEUS.prepare(ctx)
    config = (tmp_path / "data" / "prometheus" / "prometheus.yml").read_text()
    assert '- targets: ["127.0.0.1:1005", "127.0.0.1:1006"]' in config
    assert f'credentials_file: "{optional.admin_secret(ctx)}"' in config
    optional.admin_secret(ctx).write_text("the-admin-secret\n")  # the first gateway's
    optional.PROMETHEUS.prepare(ctx)
    assert (
        "the-admin-secret" not in (tmp_path / "data" / "prometheus" / "prometheus.yml").read_text()
    )
    assert "--web.listen-address=127.0.0.1:1011" in optional.PROMETHEUS.argv(ctx)


def test_with_openfaas_gateway_the_one_prometheus_scrapes_it_without_the_secret(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, prometheus=1011, openfaas_gateway=8080, openfaas_gateway_metrics=8082)
    prom = optional.prometheus_server(ctx)
    assert prom.targets == ["127.0.0.1:8082"]  # OpenFaaS's metrics need no credential
    assert prom.bearer_targets == ["127.0.0.1:1005", "127.0.0.1:1006"]
    from fedfaas.platform import openfaas_gateway
    from fedfaas.platform.orchestrator import Platform
    from fedfaas.settings import PlatformSettings

    assert optional.PROMETHEUS in openfaas_gateway.PARTS
    settings = PlatformSettings(state_dir=tmp_path / "state", with_parts=["all", "prometheus"])
    names = [p.name for p in Platform(settings, openfaas_gateway=Path("/bin/true")).parts]
    assert names.count("prometheus") == 1  # --with prometheus beside --openfaas-gateway


def test_prometheus_is_started_only_when_named(tmp_path: Path) -> None:
    assert "prometheus" not in {p.name for p in optional.resolve(["all"])}
    names = [p.name for p in optional.resolve(["all", "prometheus"])]
    assert names.index("prometheus") < names.index("console")  # up before the console asks it
    assert [p.name for p in optional.resolve(["prometheus"])] == ["prometheus"]
    with pytest.raises(KeyError, match="grafana"):
        optional.resolve(["prometheus", "grafana"])
