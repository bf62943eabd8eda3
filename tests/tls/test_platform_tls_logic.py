"""What ``fedfaas up --tls`` renders, without starting anything: the certificates it mints,
the parts' https URLs and ``tls_*`` flags, TLS as the default, and how Prometheus and
OpenFaaS's gateway reach the https parts."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from core.tls import CA_FILE_ENV, TlsFiles
from fedfaas.platform import pki
from fedfaas.platform.context import Context
from fedfaas.platform.optional import (
    CACHE_ENGINE,
    CONSOLE,
    CONTROL_PLANE,
    GATEWAY,
    REQUEST_TRACKER,
)
from fedfaas.platform.orchestrator import Platform
from fedfaas.platform.parts import RUNTIME
from fedfaas.platform.state import PlatformState
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
    # its internal routes take the control plane's and the gateways' certificates only
    names = gw[gw.index("--tls-internal-names") + 1].split(",")
    assert sorted(names) == ["control-plane", "gateway-node0", "gateway-node1"]
    assert set(names) <= set(pki.CERTIFIED) and "functions" not in names
    cp = CONTROL_PLANE.argv(ctx)
    assert cp[cp.index("--tls-key-file") + 1] == str(ctx.tls_dir / "control-plane.key")
    assert "https://" in cp[cp.index("--gateways") + 1]
    # the runtime's replicas serve HTTPS with the functions' own certificate
    rt = RUNTIME.argv(ctx)
    assert rt[rt.index("--function-tls-cert-file") + 1] == str(ctx.tls_dir / "functions.crt")
    assert rt[rt.index("--function-tls-key-file") + 1] == str(ctx.tls_dir / "functions.key")
    assert "functions" in pki.CERTIFIED
    # the cache engine, which only the platform's parts call, requires their certificates;
    # the parts the SDK, faas-cli or a browser call take a certificate when one is presented
    engine = CACHE_ENGINE.argv(ctx)
    assert engine[engine.index("--tls-client-certs") + 1] == "required"
    for part in (GATEWAY, CONTROL_PLANE, RUNTIME, REQUEST_TRACKER, CONSOLE):
        argv = part.argv(ctx)
        flag = argv.index("--tls-client-certs") if "--tls-client-certs" in argv else None
        assert flag is None or argv[flag + 1] == "optional", part.name
    # the CA for the functions' calls back in, under the platform's own name: SSL_CERT_FILE
    # would make a function's calls to outside https services trust this CA alone
    assert ctx.env()[CA_FILE_ENV] == str(ctx.ca_file) and "SSL_CERT_FILE" not in ctx.env()
    plain = _ctx(tmp_path, tls=False)
    assert plain.url("gateway").startswith("http://") and "--tls-cert-file" not in GATEWAY.argv(
        plain
    )
    assert CA_FILE_ENV not in plain.env() and plain.client_ssl() is None
    plain_gw = GATEWAY.argv(plain)
    assert plain_gw[plain_gw.index("--tls-internal-names") + 1] == ""
    assert "--function-tls-cert-file" not in RUNTIME.argv(plain)


def test_tls_is_the_default_of_load_settings_and_of_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One field decides: ``load_settings`` and ``fedfaas up`` serve TLS unless ``--no-tls``
    or ``FEDFAAS_TLS=false`` says otherwise (``--tls`` is still taken, and wins over the
    environment)."""
    from fedfaas.cli import build_parser

    monkeypatch.delenv("FEDFAAS_TLS", raising=False)
    assert load_settings(state_dir=tmp_path).tls is True

    def up_tls(*argv: str) -> bool:
        args = build_parser().parse_args(["up", *argv])
        return bool(load_settings(state_dir=tmp_path, tls=args.tls).tls)

    assert up_tls() is True and up_tls("--tls") is True and up_tls("--no-tls") is False
    monkeypatch.setenv("FEDFAAS_TLS", "false")
    assert load_settings(state_dir=tmp_path).tls is False
    assert up_tls() is False and up_tls("--tls") is True


def test_prometheus_scrapes_the_node_gateways_over_https_with_fedfaas_s_certificate(
    tmp_path: Path,
) -> None:
    """``--with prometheus`` on a TLS platform: the node gateways' job is scraped with
    ``scheme: https`` and a ``tls_config`` naming the CA and ``fedfaas``'s certificate and
    key; on a plain platform over http, with none."""
    import yaml

    from fedfaas.platform.optional import prometheus_server

    for tls in (True, False):
        ctx = _ctx(tmp_path / str(tls), tls=tls)
        server = prometheus_server(ctx)
        server.prepare()
        (job,) = [
            j
            for j in yaml.safe_load(server.config_path.read_text())["scrape_configs"]
            if j["job_name"] == "fedfaas-bearer"
        ]
        gateways = {f"127.0.0.1:{PART_PORTS[p]}" for p in ("gateway", "gateway_node1")}
        assert set(job["static_configs"][0]["targets"]) == gateways
        if tls:
            assert job["scheme"] == "https"
            assert job["tls_config"] == {
                "ca_file": str(ctx.ca_file),
                "cert_file": str(ctx.tls_dir / "fedfaas.crt"),
                "key_file": str(ctx.tls_dir / "fedfaas.key"),
            }
        else:
            assert "scheme" not in job and "tls_config" not in job


def test_openfaas_s_gateway_trusts_the_platform_s_ca_through_ssl_cert_file(
    tmp_path: Path,
) -> None:
    """``--openfaas-gateway`` on a TLS platform: the gateway (Go) gets ``SSL_CERT_FILE``
    naming the platform's CA, to verify the https runtime it calls as its provider; the
    parts themselves never get it (a function's outside calls keep the system's CAs)."""
    from fedfaas.platform.openfaas_gateway import OPENFAAS_GATEWAY

    tls = _ctx(tmp_path, tls=True)
    env = OPENFAAS_GATEWAY.env(tls)
    assert env["SSL_CERT_FILE"] == str(tls.ca_file)
    assert env["functions_provider_url"] == f"{tls.url('runtime')}/"
    assert env["functions_provider_url"].startswith("https://")
    plain = _ctx(tmp_path, tls=False)
    assert "SSL_CERT_FILE" not in OPENFAAS_GATEWAY.env(plain)
    Platform(load_settings(state_dir=tmp_path, with_parts=["prometheus"]))  # no refusal now


def test_fedfaas_s_own_probe_presents_its_certificate_to_a_server_that_requires_one(
    tmp_path: Path,
) -> None:
    """``Context.http_ok`` (the readiness probes) verifies the part against the CA and presents
    ``fedfaas``'s certificate: a server requiring client certificates answers it, and refuses
    a client that trusts the CA but presents none."""
    import http.server
    import threading
    import urllib.error
    import urllib.request

    ctx = _ctx(tmp_path, tls=True)
    pki.mint(ctx)
    server_files = TlsFiles(
        ctx.tls_dir / "runtime.crt", ctx.tls_dir / "runtime.key", ctx.ca_file, "required"
    )

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    httpd.socket = server_files.server_context().wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}/healthz"
        assert ctx.http_ok(url, timeout=10)
        trust_only = ssl.create_default_context(cafile=str(ctx.ca_file))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionResetError)):
            urllib.request.urlopen(url, timeout=10, context=trust_only).read()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_recorded_tls_platform_gives_its_parts_their_certificates_again(tmp_path: Path) -> None:
    """What the supervisor restarts a part with: the context of the recorded state."""
    st = PlatformState(
        state_dir=str(tmp_path / "state"),
        platform_id="b" * 32,
        host="127.0.0.1",
        stack_file=str(tmp_path / "stack.yml"),
        started_at=0.0,
        ports=dict(PART_PORTS),
        tls=True,
    )
    ctx = Context.of(st)
    assert ctx.url("control_plane").startswith("https://")
    argv = GATEWAY.argv(ctx)
    assert argv[argv.index("--tls-cert-file") + 1] == str(ctx.tls_dir / "gateway-node0.crt")
