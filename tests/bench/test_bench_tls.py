"""Which benches start ``fedfaas up`` without its default TLS (docs/benchmarks.md, "TLS"): the
ones whose peers speak plain HTTP (bench-flstore's big rounds, bench-secagg against Flower's
``--insecure``). The fault campaign, the soak and bench-fedbuff run on the default, TLS, and
every raw HTTP call of the campaign's and the soak's harnesses says how it verifies the parts.
Each bench's start is caught where it hands the platform its settings, and stopped there:
nothing is started."""

from __future__ import annotations

import argparse
import ast
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class Stop(Exception):
    """Raised where the bench would start the platform."""


def _cli_recorder(calls: list[list[str]]) -> Any:
    def cli(state_dir: Path, args: list[str], *rest: Any, **kw: Any) -> str:
        calls.append(list(args))
        if args[0] == "up":
            raise Stop
        return ""

    return cli


def test_bench_flstore_s_platform_is_up_with_all_and_no_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import flstore_platform

    calls: list[list[str]] = []
    monkeypatch.setattr(flstore_platform, "_run_cli", _cli_recorder(calls))
    with pytest.raises(Stop):
        flstore_platform.UpWithAll(tmp_path / "state").start()
    assert calls[0] == ["up", "--with", "all", "--no-tls"]


def test_bench_secagg_s_platform_is_up_with_no_tls_as_flower_s_side_is_insecure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import secagg_fedfaas

    calls: list[list[str]] = []
    monkeypatch.setattr(secagg_fedfaas, "_cli", _cli_recorder(calls))
    with contextlib.suppress(Stop):
        secagg_fedfaas.fedfaas_secagg_round(2, [("w", [4])], {})
    assert calls[0] == ["up", "--with", "control-plane", "--no-tls"]


def _platform_recorder(seen: list[dict[str, Any]]) -> Any:
    @contextlib.contextmanager
    def platform(state_dir: Path, **overrides: Any) -> Iterator[None]:
        seen.append(overrides)
        raise Stop
        yield  # a generator: what contextmanager needs

    return platform


def test_the_fault_campaign_runs_on_the_default_tls_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.fault_kinds import FAULTS
    from bench.faults import run_fault
    from fedfaas.settings import load_settings

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr("fedfaas.demo.stack.platform", _platform_recorder(seen))
    monkeypatch.delenv("FEDFAAS_TLS", raising=False)
    with pytest.raises(Stop):
        run_fault(FAULTS["replica"], 1, 0, 1.0)
    assert "tls" not in seen[0], seen[0]  # up's default, which is TLS
    assert load_settings(state_dir=tmp_path).tls


def test_the_soak_runs_on_the_default_tls_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.soak import soak

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr("fedfaas.demo.stack.platform", _platform_recorder(seen))
    args = argparse.Namespace(fault="none", seed=13, max_rounds=1, deadline_s=10.0)
    with pytest.raises(Stop):
        soak(args)
    assert "tls" not in seen[0], seen[0]


#: the harnesses that call the platform's parts over raw HTTP (httpx), on its default TLS
#: (fault (l)'s raw sockets, bench/fault_disconnect.py, are tests/bench/test_fault_disconnect's)
HARNESSES = ["fault_platform.py", "fault_kinds.py", "fault_checks.py", "soak.py"]


@pytest.mark.parametrize("name", HARNESSES)
def test_every_raw_http_call_of_the_campaign_and_the_soak_says_how_it_verifies(
    name: str,
) -> None:
    """An httpx call without ``verify=`` trusts the system's CAs, not the platform's: on the
    default platform it fails the handshake (and a counter read that swallows errors would
    read nothing). Each such call of the harnesses names its ``verify``."""
    from bench.runinfo import ROOT

    tree = ast.parse((ROOT / "bench" / name).read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "httpx"
        and node.func.attr in {"get", "post", "put", "delete", "request", "stream", "Client"}
    ]
    assert calls, f"bench/{name} makes no httpx call: take it off HARNESSES"
    missing = [c.lineno for c in calls if not any(k.arg == "verify" for k in c.keywords)]
    assert not missing, f"bench/{name}: httpx calls without verify= at lines {missing}"


def test_bench_fedbuff_runs_on_the_default_tls_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench-fedbuff compares FedFaaS with itself: its platform is ``fedfaas up``'s default
    (no ``tls`` override), so its clients must verify against the platform's CA."""
    from bench import fedbuff
    from fedfaas.demo import stack
    from fedfaas.settings import load_settings

    given: list[dict[str, Any]] = []

    def platform(state_dir: Path, **overrides: Any) -> Any:
        given.append(overrides)
        raise Stop

    monkeypatch.setattr(stack, "platform", platform)
    with pytest.raises(Stop):
        fedbuff.run(tmp_path / "out", repeats=1)
    assert given == [{}]
    assert load_settings(state_dir=tmp_path).tls  # the default it runs on
