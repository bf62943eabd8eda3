"""The SDK over HTTPS (client.tls): every call takes the platform's CA file (``ca_file``) and
verifies the server against it, with no environment variable. On real processes: a node
gateway with its aggregator replicas and a control plane, both serving TLS; a job through
``submit_job`` to its published model, a round through ``create_job`` and ``FLClient`` on the
gateway alone, and the refusals: no CA, another CA, a CA file that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.errors import GatewayUnavailable
from client.flower import flower_arrays, flower_weights, run_numpy_client
from client.node import FLClient, create_job
from client.sdk import submit_job
from control_plane.settings import ControlPlaneSettings
from core import wire
from core.auth import Scope
from core.services import free_port
from tests.auth.test_routes_need_credentials import _tokens
from tests.dataplane.gwproc import gateway_process
from tests.dataplane.gwutil import tiny_model
from tests.tls.certs import Certs, mint, running, settings_of

pytestmark = pytest.mark.integration


@pytest.fixture()
def tls_gateway(
    tmp_path: Path, redis_url: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, Certs]]:
    """``(gateway url, admin secret, certs)``: a gateway serving TLS with its replicas. The
    harness (and the replicas it starts) trust the CA through ``SSL_CERT_FILE``; the variable is
    gone once they are up, so that what the SDK trusts here comes from ``ca_file`` alone."""
    certs = mint(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca.cert))
    with gateway_process(tmp_path, redis_url, **settings_of(certs.server)) as (gw, admin):
        assert gw.url.startswith("https://")
        monkeypatch.delenv("SSL_CERT_FILE")
        yield gw.url, admin, certs


def _weights(seed: int) -> bytes:
    return wire.encode_tensors(tiny_model(seed))


def test_create_job_and_a_round_through_flclient_over_https(
    tls_gateway: tuple[str, str, Certs],
) -> None:
    url, admin, certs = tls_gateway
    created = create_job(
        url, admin, "j1", _weights(0), rounds=1, goal=2, clients=["c0", "c1"],
        ca_file=certs.ca.cert,
    )  # fmt: skip
    for i, client in enumerate(["c0", "c1"]):
        with FLClient(url, "j1", client, created.tokens[client], ca_file=certs.ca.cert) as fl:
            assert fl.fetch_model().version == 0
            fl.upload(1, _weights(i + 1), num_samples=1)
    with FLClient(url, "j1", "c0", created.tokens["c0"], ca_file=str(certs.ca.cert)) as fl:
        model = fl.wait_for_version(1, timeout=60)
    got = wire.decode_tensors(model.data)
    want = (tiny_model(1)["layer.bias"] + tiny_model(2)["layer.bias"]) / 2
    np.testing.assert_allclose(got["layer.bias"], want, rtol=1e-6)


def test_a_gateway_the_sdk_cannot_verify_is_refused_clearly(
    tls_gateway: tuple[str, str, Certs], tmp_path: Path
) -> None:
    url, admin, certs = tls_gateway
    # without the platform's CA (the system's CAs), and with another CA: the certificate is
    # refused before anything is sent
    for ca in (None, certs.stranger.ca):
        with (
            FLClient(url, "j1", "c0", admin, ca_file=ca) as fl,
            pytest.raises(GatewayUnavailable) as e,
        ):
            fl.status()
        assert "CERTIFICATE_VERIFY_FAILED" in e.value.detail, e.value.detail
    missing = tmp_path / "no-such-ca.crt"
    with pytest.raises(FileNotFoundError, match="no-such-ca.crt"):
        FLClient(url, "j1", "c0", admin, ca_file=missing)


@pytest.fixture()
def tls_control_plane(
    tls_gateway: tuple[str, str, Certs], tmp_path: Path
) -> Iterator[tuple[str, str, Certs]]:
    """``(control plane url, admin token, certs)``: a control plane serving TLS over the TLS
    gateway, calling it over mTLS with the platform's certificate."""
    url, admin, certs = tls_gateway
    tokens = _tokens(tmp_path / "tokens")
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(admin + "\n")
    admin_file.chmod(0o600)
    plane = ControlPlaneSettings(
        port=free_port(),
        gateways=f"n1={url}",
        admin_token_file=admin_file,
        analyst_token_file=tokens[Scope.ANALYST],
        stop_grace=5,
        **settings_of(certs.client),
    )
    with running(plane.to_argv(), "127.0.0.1", plane.port, tmp_path / "control-plane.log"):
        yield f"https://127.0.0.1:{plane.port}", admin, certs


def test_submit_job_runs_a_job_over_https_to_its_model(
    tls_control_plane: tuple[str, str, Certs], tls_gateway: tuple[str, str, Certs]
) -> None:
    """The job's handle, built with ``ca_file`` once, uses it for the control plane and for
    the gateway the control plane names."""
    cp_url, admin, certs = tls_control_plane
    job = submit_job(
        cp_url, "j2", _weights(0), rounds=1, admin_token=admin, clients=["c0", "c1"],
        deadline_s=120, ca_file=certs.ca.cert,
    )  # fmt: skip
    for i, client in enumerate(["c0", "c1"]):
        with job.client(client, round=1, timeout=60) as fl:
            assert fl.gateway_url == tls_gateway[0]
            fl.upload(1, _weights(i + 1), num_samples=1)
    job.wait(timeout=120)
    got = wire.decode_tensors(job.model().data)
    want = (tiny_model(1)["layer.bias"] + tiny_model(2)["layer.bias"]) / 2
    np.testing.assert_allclose(got["layer.bias"], want, rtol=1e-6)


class _AddOne:
    """A NumPyClient that adds 1 to every parameter, on 3 examples."""

    def fit(
        self, parameters: list[Any], config: dict[str, Any]
    ) -> tuple[list[Any], int, dict[str, Any]]:
        return [p + 1 for p in parameters], 3, {}

    def evaluate(
        self, parameters: list[Any], config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        return float(np.sum(parameters[0])), 3, {}


def test_the_flower_adapter_takes_part_over_https(
    tls_control_plane: tuple[str, str, Certs],
) -> None:
    cp_url, admin, certs = tls_control_plane
    start = [np.zeros(4, np.float32)]
    job = submit_job(
        cp_url, "j3", flower_weights(start), rounds=2, admin_token=admin, clients=["c0"],
        deadline_s=120, ca_file=certs.ca.cert,
    )  # fmt: skip
    rounds = run_numpy_client(
        _AddOne(), cp_url, "j3", "c0", job.tokens["c0"], timeout=120, ca_file=certs.ca.cert
    )
    assert [(r.round, r.error, r.loss) for r in rounds] == [(1, None, 0.0), (2, None, 4.0)]
    (final,) = flower_arrays(job.model().data)
    np.testing.assert_array_equal(final, np.full(4, 2, np.float32))
