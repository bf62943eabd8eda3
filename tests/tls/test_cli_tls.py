"""``fedfaas``'s own clients of a TLS platform: the smoke run's invocation of ``echo`` through
a runtime that serves HTTPS (``fedfaas up``'s default, ``--tls``), and ``fedfaas calibrate``
against real TLS node gateways with real aggregators, each verifying the server against the
platform's CA (``--ca-file``, or the one in ``--state-dir``) and nothing else (``SSL_CERT_FILE``
unset)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.commands import run_module
from tests.control.realgw import real_gateways
from tests.control.test_calibrate_cli import QUICK
from tests.platform.conftest import ANY_PORTS
from tests.tls.certs import mint, settings_of

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_smoke_run_invokes_echo_over_https_verifying_the_platform_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedfaas.platform import smoke
    from fedfaas.settings import PlatformSettings

    monkeypatch.delenv("OPENFAAS_URL", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the CA comes from the platform alone
    settings = PlatformSettings(
        state_dir=tmp_path / "s", stack_file=REPO / "stack.yml", tls=True, **ANY_PORTS
    )
    lines: list[str] = []
    smoke.run(settings, lines.append)
    text = "\n".join(lines)
    assert "invoking echo at https://" in text, text
    assert "echo answered 200 with the payload" in text and "smoke run passed" in text
    assert sorted(p.name for p in settings.state_dir.iterdir()) == ["logs"]


def _calibrate(url: str, secret: Path, *more: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    done = run_module(
        "fedfaas.cli",
        "calibrate",
        "--gateway",
        url,
        "--admin-secret-file",
        str(secret),
        *QUICK,
        *more,
        timeout=300,
        env=env,
    )
    return done.returncode, done.stdout, done.stderr


def test_calibrate_measures_a_tls_gateway_verifying_it_against_the_ca_file(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = mint(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca.cert))  # the fixture's own probes
    with real_gateways(redis_url, tmp_path, ("n1",), settings_of(certs.server)) as (urls, _, _):
        assert urls["n1"].startswith("https://")
        secret = tmp_path / "secret"
        # without the CA (and no platform in --state-dir) the system's CAs are trusted, and
        # the gateway is not one of theirs
        code, _, err = _calibrate(urls["n1"], secret, "--state-dir", str(tmp_path / "none"))
        assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in err, err
        # another CA's certificate file: refused the same way
        other_ca = tmp_path / "pki" / "other-ca" / "ca.crt"
        code, _, err = _calibrate(urls["n1"], secret, "--ca-file", str(other_ca))
        assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in err, err
        code, out, err = _calibrate(urls["n1"], secret, "--ca-file", str(certs.ca.cert))
        assert code == 0, err
        # no --ca-file: the CA of the platform in --state-dir (<state>/secrets/tls/ca.crt)
        state_dir = tmp_path / "state"
        (state_dir / "secrets" / "tls").mkdir(parents=True)
        shutil.copy(certs.ca.cert, state_dir / "secrets" / "tls" / "ca.crt")
        code, again, err = _calibrate(urls["n1"], secret, "--state-dir", str(state_dir))
        assert code == 0, err
    for report in (json.loads(out), json.loads(again)):
        assert report["mc"] > 0 and report["levels"] == [1, 2]


def test_calibrate_names_a_missing_ca_file_with_exit_code_2(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("x")
    code, _, err = _calibrate(
        "https://127.0.0.1:1", secret, "--ca-file", str(tmp_path / "no-such-ca.crt")
    )
    assert code == 2 and "no-such-ca.crt" in err, err
