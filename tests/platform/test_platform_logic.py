"""Pure logic of the platform: part order, port choice, state files, rendering, settings."""

from __future__ import annotations

import contextlib
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.services.process import PORT_RANGE_ENV, port_range
from fedfaas.platform import (
    PartStatus,
    Platform,
    PlatformError,
    PortInUse,
    PortSpec,
    ServiceSpec,
    StatusReport,
    credentials,
    render_status,
    state,
)
from fedfaas.platform.functions import FunctionInfo
from fedfaas.platform.parts import PARTS, ordered
from fedfaas.settings import PlatformSettings, load_settings
from tests.platform.conftest import ANY_PORTS, part_context


def _spec(
    name: str, depends: tuple[str, ...] = (), ports: tuple[PortSpec, ...] = ()
) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        ports=ports,
        argv=lambda ctx: [sys.executable, "-c", "pass"],
        ready=lambda ctx: True,
        address=lambda ctx: name,
        depends=depends,
    )


@pytest.fixture()
def listener() -> Iterator[int]:
    """A port that something listens on for the duration of the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_parts_start_after_what_they_depend_on() -> None:
    parts = [
        _spec("runtime", ("minio", "redis")),
        _spec("minio"),
        _spec("gateway", ("runtime",)),
        _spec("redis"),
    ]
    names = [p.name for p in ordered(parts)]
    assert names.index("minio") < names.index("runtime") < names.index("gateway")
    assert names.index("redis") < names.index("runtime")


def test_default_parts_start_minio_then_redis_then_runtime() -> None:
    assert [p.name for p in ordered(PARTS)] == ["minio", "redis", "runtime"]


def test_unknown_dependency_and_cycle_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown part nope"):
        ordered([_spec("a", ("nope",))])
    with pytest.raises(ValueError, match="cycle"):
        ordered([_spec("a", ("b",)), _spec("b", ("a",))])


def test_explicit_port_that_is_taken_is_a_clear_error(tmp_path: Path, listener: int) -> None:
    settings = PlatformSettings(state_dir=tmp_path, ports={"thing": listener})
    platform = Platform(settings, parts=[_spec("thing", ports=(PortSpec("thing", 1),))])
    with pytest.raises(PortInUse) as err:
        platform._choose_ports()
    assert err.value.port == listener
    assert "already in use" in str(err.value) and "=0" in str(err.value)


def test_taken_default_port_falls_back_to_a_free_one(tmp_path: Path, listener: int) -> None:
    settings = PlatformSettings(state_dir=tmp_path)
    parts = [_spec("a", ports=(PortSpec("a", listener),)), _spec("b", ports=(PortSpec("b", 0),))]
    ports = Platform(settings, parts=parts)._choose_ports()
    assert ports["a"] != listener and ports["b"] not in (0, ports["a"])


def test_port_zero_means_any_free_port_and_ports_are_distinct(tmp_path: Path) -> None:
    settings = PlatformSettings(state_dir=tmp_path, **ANY_PORTS)
    ports = Platform(settings)._choose_ports()
    assert set(ports) == {"runtime", "minio", "minio_console", "redis"}
    assert len(set(ports.values())) == 4 and 0 not in ports.values()


def _free_block(size: int) -> int:
    """The first port of ``size`` consecutive ports of the free-port range free right now."""
    first, end = port_range()
    for start in range(first, end - size + 1, size):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(start, start + size):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return start
    raise AssertionError(f"no {size} consecutive free ports in {first}-{end - 1}")


@pytest.mark.timeout(30)  # the draw once went on forever here: a regression fails, not hangs
def test_a_port_range_too_small_for_the_parts_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _free_block(4)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{start}-{start + 3}")
    with socket.socket() as busy:  # one of the 4 is taken: 3 free for 4 ports
        busy.bind(("127.0.0.1", start + 2))
        busy.listen()
        with pytest.raises(PlatformError) as err:
            Platform(PlatformSettings(state_dir=tmp_path, **ANY_PORTS))._choose_ports()
    said = str(err.value)
    assert "needs 4 free ports" in said and "for minio, minio_console, redis, runtime," in said
    assert f"{start}-{start + 3}, has 3 free" in said and f"widen {PORT_RANGE_ENV}" in said
    monkeypatch.setenv(PORT_RANGE_ENV, f"{start}-{start + 1}")  # fewer ports than the parts
    with pytest.raises(PlatformError, match=f"needs 4 free ports.*{start}-{start + 1}, has 2"):
        Platform(PlatformSettings(state_dir=tmp_path, **ANY_PORTS))._choose_ports()


@pytest.mark.timeout(30)
def test_a_range_just_large_enough_gives_each_part_one_of_its_free_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _free_block(5)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{start}-{start + 4}")
    with socket.socket() as busy:  # the range's 4 other ports are all the parts can have
        busy.bind(("127.0.0.1", start + 1))
        busy.listen()
        ports = Platform(PlatformSettings(state_dir=tmp_path, **ANY_PORTS))._choose_ports()
    assert sorted(ports.values()) == [start, start + 2, start + 3, start + 4]


def test_settings_read_the_fedfaas_env_prefix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FEDFAAS_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("FEDFAAS_REDIS_PORT", "0")
    monkeypatch.setenv("FEDFAAS_PORTS", '{"gateway": 8090}')
    settings = load_settings(runtime_port=8181)
    assert settings.state_dir == tmp_path / "s"
    assert settings.port_setting("redis") == 0
    assert settings.port_setting("runtime") == 8181
    assert settings.port_setting("gateway") == 8090
    assert settings.port_setting("minio") is None


def test_state_round_trips_through_json_and_clean_keeps_only_logs(tmp_path: Path) -> None:
    state.prepare_dir(tmp_path)
    st = state.PlatformState(
        state_dir=str(tmp_path),
        platform_id="x",
        host="127.0.0.1",
        stack_file="stack.yml",
        started_at=1.0,
        ports={"redis": 1},
    )
    st.services.append(
        state.ServiceRecord(
            "redis", 42, 1.5, {"redis": 1}, "redis://h:1/0", str(tmp_path / "logs" / "redis.log")
        )
    )
    state.save(st)
    assert state.load(tmp_path) == st
    (tmp_path / "data" / "redis").mkdir(parents=True)
    (tmp_path / "logs" / "redis.log").write_text("hello")
    state.clean(tmp_path)
    assert state.leftovers(tmp_path) == []
    assert (tmp_path / "logs" / "redis.log").read_text() == "hello"
    state.clean(tmp_path, keep_logs=False)
    assert not tmp_path.exists()


def test_corrupt_state_file_is_reported_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(state.StateDirError, match="cannot read"):
        state.load(tmp_path)


def test_state_dir_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(state.StateDirError, match="not a folder"):
        state.prepare_dir(f)


def test_second_command_on_a_locked_state_dir_is_refused(tmp_path: Path) -> None:
    with (
        state.locked(tmp_path),
        pytest.raises(state.StateDirError, match="another fedfaas"),
        state.locked(tmp_path),
    ):
        pass


def test_secrets_are_private_files_generated_once(tmp_path: Path) -> None:
    d = tmp_path / "secrets"
    credentials.ensure(d)
    user, password = credentials.basic_auth(d)
    assert user == "admin" and len(password) >= 24
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    credentials.ensure(d)
    assert credentials.basic_auth(d) == (user, password)


def test_status_table_shows_parts_functions_and_ebpf_mode() -> None:
    report = StatusReport(
        state_dir="/s",
        running=True,
        parts=[
            PartStatus(
                "minio",
                "http://127.0.0.1:9000",
                10,
                True,
                True,
                {"console": "http://127.0.0.1:9001"},
            ),
            PartStatus("redis", "redis://127.0.0.1:6379/0", 11, False, False),
        ],
        functions=[FunctionInfo("echo", 1, 1)],
        ebpf_mode="userspace",
        ebpf_reason="bpf component not available",
    )
    text = render_status(report)
    assert "console http://127.0.0.1:9001" in text
    assert "echo 1/1" in text
    assert "DEGRADED" in text and not report.healthy
    assert "eBPF: userspace (bpf component not available)" in text
    assert report.to_json()["healthy"] is False


def test_status_of_a_platform_never_started_says_not_running(tmp_path: Path) -> None:
    report = Platform(PlatformSettings(state_dir=tmp_path / "none")).status()
    assert not report.running and not report.healthy
    assert report.ebpf_mode in ("ebpf", "userspace") and report.ebpf_reason
    assert "not running" in render_status(report)


def test_optional_parts_bring_what_they_depend_on() -> None:
    from fedfaas.platform import optional

    assert [p.name for p in optional.resolve(["request-tracker"])] == [
        "cache-engine",
        "request-tracker",
    ]
    # one gateway per node: `--with gateway` starts node1's too, after node0's
    assert [p.name for p in optional.resolve(["gateway"])] == ["gateway", "gateway-node1"]
    assert [p.name for p in optional.resolve(["control-plane"])] == [
        "gateway",
        "gateway-node1",
        "control-plane",
    ]
    # `all`: every part but Prometheus, which starts only when named
    assert {p.name for p in optional.resolve(["all"])} == set(optional.OPTIONAL) - {"prometheus"}
    names = [p.name for p in Platform(PlatformSettings(with_parts=["control-plane"])).parts]
    assert (
        names.index("runtime")
        < names.index("gateway")
        < names.index("gateway-node1")
        < names.index("control-plane")
    )


def test_gateway_parts_render_their_settings_and_place_replicas_on_their_nodes(
    tmp_path: Path,
) -> None:
    """Both node gateways' command lines come from ``GatewaySettings.to_argv``; they share one
    admin secret file, know each other as peers, and the runtime places replicas on both nodes
    with the router socket each gateway listens on. No secret is on a command line."""
    from fedfaas.platform import optional
    from fedfaas.platform.parts import RUNTIME
    from gateway.__main__ import parse_settings
    from runtime.settings import RuntimeSettings

    ctx = part_context(tmp_path)
    argv0 = optional.GATEWAY.argv(ctx)
    argv1 = optional.GATEWAY_NODE1.argv(ctx)
    s0, s1 = parse_settings(argv0[3:]), parse_settings(argv1[3:])
    assert (s0.node, s0.port, s1.node, s1.port) == ("node0", 1005, "node1", 1006)
    assert s0.peers == {"node1": "http://127.0.0.1:1006"}
    assert s1.peers == {"node0": "http://127.0.0.1:1005"}
    assert s0.admin_secret_file == s1.admin_secret_file == optional.admin_secret(ctx)
    assert s0.engine_url == "http://127.0.0.1:1007"
    want = optional.gateway_settings(ctx, "node0")
    assert s0 == want
    # secrets travel as the paths of the gateway's own files, never in the environment
    assert optional.GATEWAY.env(ctx) == {}
    assert s0.minio_credentials_file == ctx.secrets_dir / "minio-gateway.json"
    assert s0.redis_credentials_file == ctx.secrets_dir / "redis-gateway.json"
    runtime, _ = RuntimeSettings.from_argv(RUNTIME.argv(ctx)[3:])
    assert runtime.nodes == {"node0": s0.router_socket, "node1": s1.router_socket}
    assert s0.router_socket != s1.router_socket
    assert len(str(s0.router_socket)) < 100  # a unix socket path holds 108 bytes
    secrets = [credentials.read(ctx.secrets_dir, n) for n in (credentials.MINIO_PASSWORD,)]
    everything = argv0 + argv1 + RUNTIME.argv(ctx)
    everything += [a for p in optional.OPTIONAL.values() for a in p.argv(ctx)]
    assert not any(s in a for s in secrets for a in everything)


def test_unknown_optional_part_is_a_clear_error() -> None:
    from fedfaas.platform import PlatformError

    with pytest.raises(PlatformError, match="unknown part 'bogus'; choose from gateway"):
        Platform(PlatformSettings(with_parts=["bogus"]))
