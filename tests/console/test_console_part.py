"""``fedfaas up --with console``: the part's command line, from ``ConsoleSettings.to_argv``."""

from __future__ import annotations

from pathlib import Path

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
