"""The locust load tests (``loadtests/``) on ``fedfaas up``'s default, TLS: how their users find
the platform's CA (:mod:`loadtests.platform_ca`), and ``loadtests/locustfile.py``'s analysts
run headless against a TLS platform's request tracker, every query answered. (The soak's
``loadtests/platform.py`` runs in ``tests/bench/test_soak.py``'s short soak.)"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from bench.fault_checks import small_model
from bench.fault_platform import Campaign
from bench.runinfo import ROOT
from bench.soak_stats import read_stats
from loadtests.platform_ca import ca_file, platform_client, trust
from tests.polling import wait_until


def _secrets_with_ca(tmp_path: Path) -> Path:
    from core.tls import mint_ca

    secrets = tmp_path / "secrets"
    ca = mint_ca(secrets / "tls-ca")
    (secrets / "tls").mkdir(parents=True)
    (secrets / "tls" / "ca.crt").write_bytes(ca.cert.read_bytes())
    return secrets


def test_the_users_take_the_named_ca_else_the_one_fedfaas_up_wrote_else_none(
    tmp_path: Path,
) -> None:
    secrets = _secrets_with_ca(tmp_path)
    found = str(secrets / "tls" / "ca.crt")
    assert ca_file("", secrets) == found  # fedfaas up's, in the secrets folder
    other = tmp_path / "other.crt"
    other.write_bytes(b"x")
    assert ca_file(str(other), secrets) == str(other)  # the environment's, first
    assert ca_file("", tmp_path / "plain-secrets") == ""  # --no-tls: the system's CAs
    with pytest.raises(FileNotFoundError, match="missing.crt does not exist"):
        ca_file(str(tmp_path / "missing.crt"), secrets)


def test_a_users_session_verifies_against_the_ca_whatever_requests_ca_bundle_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import requests

    secrets = _secrets_with_ca(tmp_path)
    ca = ca_file("", secrets)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "elsewhere.pem"))
    session = requests.Session()
    trust(session, ca)
    settings = session.merge_environment_settings("https://127.0.0.1:1/", {}, None, None, None)
    assert settings["verify"] == ca
    plain = requests.Session()
    trust(plain, "")  # no CA: the session is left as it was
    assert plain.verify is True and plain.trust_env


def test_the_engine_read_presents_fedfaas_s_certificate_where_the_secrets_hold_it(
    tmp_path: Path,
) -> None:
    from core.tls import mint_ca, mint_cert

    secrets = tmp_path / "secrets"
    ca = mint_ca(secrets / "tls")
    own = mint_cert(ca, secrets / "tls", "fedfaas", ["127.0.0.1"])
    assert own.cert == secrets / "tls" / "fedfaas.crt"
    ctx = platform_client(str(ca.cert), secrets)
    assert not isinstance(ctx, bool) and ctx.get_ca_certs()
    assert platform_client("", secrets) is True


def _round(p: Any, job: str, tokens: dict[str, str], rnd: int, verify: Any) -> None:
    """Every client of ``job`` uploads its update of round ``rnd`` through the SDK."""
    from client.sdk import FLClient

    model = small_model()
    # the control plane opens round ``rnd`` a moment after it counts the last one closed (its
    # plan pushed to the gateways first): an assignment asked in between is refused
    admin = {"Authorization": f"Bearer {(p.secrets / 'gateway-admin-secret').read_text().strip()}"}

    def is_open() -> bool:
        view = httpx.get(
            f"{p.urls['control_plane']}/v1/jobs/{job}", headers=admin, timeout=10, verify=verify
        )
        cur = (view.json().get("round") or {}) if view.status_code == 200 else {}
        return bool(cur.get("number") == rnd and cur.get("state") == "open")

    wait_until(is_open, 120, f"round {rnd} of {job} open on the control plane", interval=0.1)
    for i, (client, token) in enumerate(sorted(tokens.items())):
        a = httpx.get(
            f"{p.urls['control_plane']}/v1/jobs/{job}/assignment",
            params={"client": client},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            verify=verify,
        )
        assert a.status_code == 200, a.text
        with FLClient(a.json()["gateway_url"], job, client, token, ca_file=p.ca_file) as fl:
            deadline = time.monotonic() + 120
            while int(fl.status()["version"]) < rnd - 1:
                assert time.monotonic() < deadline, f"no model {rnd - 1} for {client}"
                time.sleep(0.1)
            fl.upload(rnd, save(model.update(100 * rnd + i)), 1 + i % 3)


@pytest.mark.slow
def test_the_flstore_locustfile_runs_on_the_default_tls_platform(tmp_path: Path) -> None:
    """``fedfaas up --with all`` (TLS), a job of 6 clients with 2 rounds in FLStore, then 20 s
    of ``loadtests/locustfile.py`` against the https request tracker, the CA found in the
    secrets folder and the job read from the engine (mTLS, ``fedfaas``'s certificate): every
    query answered, none failed (a job not found, 404, would fail them)."""
    from fedfaas.demo.stack import platform

    ports = dict.fromkeys(
        ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane"), 0
    )
    job = "locust"
    with platform(tmp_path / "state", ports=ports) as p:
        assert p.tls and p.urls["request_tracker"].startswith("https://")
        clients = [f"c{i}" for i in range(6)]
        body = {
            "job": job,
            "rounds": 2,
            "goal": len(clients),
            "clients": clients,
            "overprovision": 1.0,
            "policy": "leastconn",
            "weights_b64": base64.b64encode(save(small_model().zeros())).decode(),
        }
        r = Campaign(p, np.random.default_rng(0)).post_job(body)
        assert r.status_code == 201, r.text
        tokens = r.json()["tokens"]
        for rnd in (1, 2):
            _round(p, job, tokens, rnd, p.verify)
        engine_read = {"Authorization": f"Bearer {(p.secrets / 'admin-token').read_text().strip()}"}
        deadline = time.monotonic() + 120
        while True:  # FLStore ingests a round once its model is published
            st = httpx.get(
                f"{p.urls['cache_engine']}/v1/state",
                headers=engine_read,
                timeout=10,
                verify=p.verify,
            ).json()
            if set(st.get("jobs", {}).get(job, [])) >= {1, 2}:
                break
            assert time.monotonic() < deadline, st.get("jobs")
            time.sleep(0.5)
        env = {
            **os.environ,
            "FLSTORE_ENGINE": p.urls["cache_engine"],
            "FLSTORE_SECRETS": str(p.secrets),
            "PYTHONPATH": str(ROOT),
        }
        env.pop("REQUESTS_CA_BUNDLE", None)
        env.pop("FLSTORE_CA_FILE", None)
        argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py")]
        # the users stop at 20 s; a query under way then is let finish (its answer counted)
        argv += ["--headless", "--only-summary", "-u", "4", "-r", "4", "-t", "20s"]
        argv += ["--stop-timeout", "60"]
        argv += ["--host", p.urls["request_tracker"], "--csv", str(tmp_path / "locust")]
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    said = done.stdout[-3000:] + done.stderr[-3000:]
    rows = {x["route"]: x for x in read_stats(tmp_path / "locust")}
    assert rows["Aggregated"]["requests"] > 0, said
    assert rows["Aggregated"]["failures"] == 0, said
    assert rows["cosine-to-aggregate"]["requests"] > 0 and rows["multi-krum"]["requests"] > 0
    assert done.returncode == 0, done.stderr[-2000:]
