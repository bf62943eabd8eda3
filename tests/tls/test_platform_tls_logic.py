"""What ``fedfaas up --tls`` renders, without starting anything: the certificates it mints,
the parts' https URLs and ``tls_*`` flags, and the parts it refuses beside TLS."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from core.tls import TlsFiles
from fedfaas.platform import pki
from fedfaas.platform.context import Context
from fedfaas.platform.errors import PlatformError
from fedfaas.platform.optional import CONTROL_PLANE, GATEWAY
from fedfaas.platform.orchestrator import Platform
from fedfaas.settings import load_settings
from tests.platform.conftest import PART_PORTS


def _ctx(tmp_path: Path, tls: bool) -> Context:
    return Context(
        state_dir=tmp_path / "state",
        host="127.0.0.1",
        stack_file=tmp_path / "stack.yml",
        platform_id="a" * 32,
        ports=dict(PART_PORTS),
        tls=tls,
    )


def test_the_parts_certificates_are_minted_private_and_signed_by_the_ca(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, tls=True)
    pki.mint(ctx)
    assert stat.S_IMODE(ctx.tls_dir.stat().st_mode) == 0o700
    assert not (ctx.tls_dir / "ca.key").exists()
    for part in pki.CERTIFIED:
        files = TlsFiles(ctx.tls_dir / f"{part}.crt", ctx.tls_dir / f"{part}.key", ctx.ca_file)
        files.check()  # present, the key 0600
        assert stat.S_IMODE(files.cert.stat().st_mode) == 0o600
        files.server_context()  # the key fits the certificate
    store = ssl.create_default_context(cafile=str(ctx.ca_file))
    assert len(store.get_ca_certs()) == 1
    # a node gateway's certificate names its node (what discovery checks), beside the host
    node1 = x509.load_pem_x509_certificate((ctx.tls_dir / "gateway-node1.crt").read_bytes())
    san = node1.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "node1"}


def test_on_a_tls_platform_the_parts_urls_are_https_and_their_flags_name_their_files(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, tls=True)
    assert ctx.url("gateway").startswith("https://") and ctx.url("runtime").startswith("https://")
    assert ctx.url("minio") == f"http://127.0.0.1:{PART_PORTS['minio']}"  # MinIO stays plain
    gw = GATEWAY.argv(ctx)
    assert gw[gw.index("--tls-cert-file") + 1] == str(ctx.tls_dir / "gateway-node0.crt")
    assert gw[gw.index("--tls-ca-file") + 1] == str(ctx.ca_file)
    assert gw[gw.index("--engine") + 1].startswith("https://")
    cp = CONTROL_PLANE.argv(ctx)
    assert cp[cp.index("--tls-key-file") + 1] == str(ctx.tls_dir / "control-plane.key")
    assert "https://" in cp[cp.index("--gateways") + 1]
    assert ctx.env()["SSL_CERT_FILE"] == str(ctx.ca_file)
    plain = _ctx(tmp_path, tls=False)
    assert plain.url("gateway").startswith("http://") and "--tls-cert-file" not in GATEWAY.argv(
        plain
    )
    assert "SSL_CERT_FILE" not in plain.env() and plain.client_ssl() is None


@pytest.mark.parametrize("extra", [{"with_parts": ["prometheus"]}, {"openfaas_gateway": True}])
def test_tls_is_refused_beside_the_parts_that_call_over_plain_http(
    tmp_path: Path, extra: dict[str, object]
) -> None:
    settings = load_settings(state_dir=tmp_path, tls=True, with_parts=extra.get("with_parts"))
    gateway = tmp_path / "openfaas-gateway" if extra.get("openfaas_gateway") else None
    with pytest.raises(PlatformError, match="--tls does not work with"):
        Platform(settings, openfaas_gateway=gateway)
    Platform(load_settings(state_dir=tmp_path, with_parts=extra.get("with_parts")))  # no TLS: ok
