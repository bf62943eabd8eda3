"""``fedfaas calibrate`` against a real node gateway with real aggregators."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from core.services import free_port
from tests.commands import run_module
from tests.control.realgw import real_gateways

#: a calibration small enough for a test: 20000 parameters, levels 1 and 2, one repeat each
QUICK = ("--params", "20000", "--levels", "1,2", "--repeats", "1")


def _fedfaas(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("fedfaas.cli", *args, timeout=300)


@pytest.mark.integration
def test_calibrate_measures_a_positive_capacity_on_a_real_gateway(
    tmp_path: Path, redis_url: str
) -> None:
    with real_gateways(redis_url, tmp_path, ("n1",)) as (urls, _secret, _procs):
        done = _fedfaas(
            "calibrate",
            "--gateway",
            urls["n1"],
            "--admin-secret-file",
            str(tmp_path / "secret"),
            *QUICK,
        )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mc"] > 0 and report["levels"] == [1, 2]
    assert all(e > 0 for e in report["exec_s"]) and report["params"] == 20000


def test_calibrate_rejects_bad_levels_with_exit_code_2(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("x")
    for levels in ("0,1", "4,2", "a"):
        done = _fedfaas(
            "calibrate",
            "--gateway",
            "http://127.0.0.1:1",
            "--admin-secret-file",
            str(secret),
            "--levels",
            levels,
        )
        assert done.returncode == 2, levels
        assert "levels must be" in done.stderr or "not a list of integers" in done.stderr


def test_calibrate_against_an_unreachable_gateway_fails_cleanly(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("x")
    done = _fedfaas(
        "calibrate",
        "--gateway",
        f"http://127.0.0.1:{free_port()}",
        "--admin-secret-file",
        str(secret),
        "--levels",
        "1",
        "--repeats",
        "1",
    )
    assert done.returncode == 1 and "calibrate: error" in done.stderr
