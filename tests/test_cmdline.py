"""Every component's command line is rendered from its settings and parses back to them."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from core.cmdline import CommandLineSettings
from gateway.settings import GatewaySettings
from request_tracker.settings import TrackerSettings
from runtime.settings import RuntimeSettings

CASES: list[CommandLineSettings] = [
    GatewaySettings(
        node="n1",
        port=9001,
        state_dir=Path("/tmp/gw"),
        peers={"n2": "http://127.0.0.1:9002"},
        prefer_ebpf=False,
        lazy=True,
        pool=3,
        router_socket=Path("/tmp/gw/r.sock"),
        minio_credentials_file=Path("/run/s/minio-gateway.json"),
        redis_credentials_file=Path("/run/s/redis-gateway.json"),
    ),
    EngineSettings(
        port=9003,
        policy="lru",
        function_env={"A": "1"},
        minio_credentials_file=Path("/run/s/minio-cache-engine.json"),
        redis_credentials_file=Path("/run/s/redis-cache-engine.json"),
    ),
    TrackerSettings(
        port=9004,
        engine_url="http://127.0.0.1:9003",
        attempts=5,
        redis_credentials_file=Path("/run/s/redis-request-tracker.json"),
    ),
    ControlPlaneSettings(
        gateways="n1=http://127.0.0.1:9001",
        tick_s=0.2,
        scale_down_s=4.0,
        redis_credentials_file=Path("/run/s/redis-control-plane.json"),
    ),
    RuntimeSettings(
        port=9005,
        auth_dir=Path("/run/s/runtime-auth"),
        ce_limits=True,
        nodes={"n1": Path("/tmp/n1.sock")},
    ),
]


@pytest.mark.parametrize("settings", CASES, ids=lambda s: type(s).__name__)
def test_command_line_round_trips(settings: CommandLineSettings) -> None:
    argv = settings.to_argv(python="python", log_level="DEBUG")
    assert argv[:3] == ["python", "-m", type(settings).MODULE]
    parsed, level = type(settings).from_argv(argv[3:])
    assert parsed == settings
    assert level == "DEBUG"


def test_every_setting_has_a_flag_and_no_setting_holds_a_secret_value() -> None:
    for cls in (GatewaySettings, EngineSettings, TrackerSettings, ControlPlaneSettings):
        missing = set(cls.model_fields) - set(cls.FLAGS)
        assert not missing, f"{cls.__name__}: {missing}"
        # secrets reach a component as the path of a 0600 file, never as a value
        valued = {n for n in cls.model_fields if any(w in n for w in ("secret", "password"))}
        assert all(n.endswith("_file") for n in valued), f"{cls.__name__}: {valued}"
    assert set(RuntimeSettings.model_fields) - set(RuntimeSettings.FLAGS) == {"python"}


def test_a_bad_value_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        GatewaySettings.from_argv(["--port", "eighty"])
    assert exc.value.code == 2
    assert "--port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        RuntimeSettings.from_argv(["--nodes", "[1, 2]"])  # not a JSON object
    assert "JSON object" in capsys.readouterr().err


def test_a_setting_without_a_flag_is_refused_rather_than_dropped() -> None:
    with pytest.raises(ValueError, match="python"):
        RuntimeSettings(auth_dir=Path("/run/s"), python="/usr/bin/python3.99").to_argv()


def test_flags_not_listed_are_one_per_setting_named_after_it() -> None:
    """A class without ``FLAGS`` gets them from its fields: ``--name-of-it``, ``--no-...`` for a
    ``True`` boolean, ``FLAG_NAMES`` for the others' names, none for ``NO_FLAG``; a class that
    lists its ``FLAGS`` keeps them."""

    class Derived(CommandLineSettings):
        MODULE: ClassVar[str] = "derived"
        FLAG_NAMES: ClassVar[dict[str, str]] = {"redis_url": "--redis"}
        NO_FLAG: ClassVar[frozenset[str]] = frozenset({"python"})

        stop_grace: float = 1.0
        redis_url: str = ""
        direct: bool = True
        lazy: bool = False
        python: str = "python3"

    assert Derived.FLAGS == {
        "stop_grace": "--stop-grace",
        "redis_url": "--redis",
        "direct": "--no-direct",
        "lazy": "--lazy",
    }
    parsed, _ = Derived.from_argv(["--stop-grace", "2", "--redis", "redis://r", "--no-direct"])
    assert (parsed.stop_grace, parsed.redis_url, parsed.direct) == (2.0, "redis://r", False)
    assert TrackerSettings.FLAGS["plan_reuse"] == "--no-plan-reuse"  # made, not listed
    assert (
        "FLAGS" in GatewaySettings.__dict__ and GatewaySettings.FLAGS["prefer_ebpf"] == "--no-ebpf"
    )
