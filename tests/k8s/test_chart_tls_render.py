"""The chart's TLS values as ``helm template`` renders them (values ``tls``, templates/_helpers.tpl,
templates/tls-certificates.yaml, templates/tls-generated.yaml): what each TLS part's pod gets,
that TLS is on by default from certificates the chart makes (a real handshake checks them),
cert-manager's Certificates, and the schema's refusals. On a real node and API server:
test_chart_on_node.py (TLS from Secrets), test_job_on_node.py (the default: the chart's own
certificates) and test_chart_on_apiserver.py (cert-manager's CRDs).
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from core.cmdline import CommandLineSettings
from core.services import find_binary
from core.tls import TlsError, TlsFiles, mint_ca, mint_cert
from gateway.settings import GatewaySettings
from request_tracker.settings import TrackerSettings

CHART = Path(__file__).resolve().parents[2] / "charts" / "fedfaas"
HELM = find_binary("helm")
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not installed: `make helm` builds it")

#: part -> (workload name, its settings class, the value of its client certificates)
PARTS: dict[str, tuple[str, type[CommandLineSettings], str]] = {
    "node-gateway": ("fedfaas-node-gateway", GatewaySettings, "optional"),
    "control-plane": ("fedfaas-control-plane", ControlPlaneSettings, "optional"),
    "cache-engine": ("fedfaas-cache-engine", EngineSettings, "required"),
    "request-tracker": ("fedfaas-request-tracker", TrackerSettings, "optional"),
}
TLS = ["--set", "tls.enabled=true"]


def _helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run(
        [HELM, "template", "fedfaas", str(chart), "--namespace", "openfaas", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _render(*args: str) -> list[dict[str, Any]]:
    res = _helm(*args)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(
        d
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == name
    )


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_with_tls_off_nothing_of_it_is_rendered() -> None:
    docs = _render("--set", "tls.enabled=false")
    assert not [d for d in docs if d["kind"] == "Certificate"]
    assert not [d for d in docs if d["kind"] == "Secret" and "-tls-" in d["metadata"]["name"]]
    for name, _, _ in PARTS.values():
        spec = _workload(docs, name)["spec"]["template"]["spec"]
        assert "tls-files" not in [c["name"] for c in spec.get("initContainers", [])]
        assert not [a for a in spec["containers"][0]["args"] if a.startswith("--tls")]
        assert not [k for k in _env(spec["containers"][0]) if "TLS" in k]
        assert "scheme" not in spec["containers"][0]["readinessProbe"]["httpGet"]


def _secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}


def _pem(secret: dict[str, Any], key: str, folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(base64.b64decode(secret["data"][key]))
    path.chmod(0o600)
    return path


def _handshake(server: TlsFiles, ca: Path, name: str, client: TlsFiles | None = None) -> str:
    """A TLS handshake on loopback with ``server``'s files, the client verifying against
    ``ca`` and ``name`` (hostname checking on) and presenting ``client``: the server's view
    of the client's common name ("" without one); an ``ssl.SSLError`` when refused."""
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(server.cert, server.key)
    srv.load_verify_locations(cafile=str(ca))
    srv.verify_mode = ssl.CERT_OPTIONAL
    cli = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        cli.load_cert_chain(client.cert, client.key)
    seen: list[str] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with srv.wrap_socket(conn, server_side=True) as tls:
                    peer = tls.getpeercert() or {}
                    seen.extend(
                        v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"
                    )
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            raw = socket.create_connection(listener.getsockname(), timeout=10)
            with raw, cli.wrap_socket(raw, server_hostname=name) as tls:
                tls.sendall(b"x")
        finally:
            thread.join(10)
    return "".join(seen)


def test_tls_is_on_by_default_from_a_ca_and_certificates_the_chart_makes(tmp_path: Path) -> None:
    docs = _render(
        "--set", "nodeGateway.perNode=2", "--set", "tls.nodeGateway.nodeNames={n1,n2}"
    )  # fmt: skip
    secrets = _secrets(docs)
    ca_secret = secrets["fedfaas-tls-ca"]
    # made once, kept across upgrades and uninstalls like the other generated secrets
    assert ca_secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert set(ca_secret["data"]) == {"tls.crt", "tls.key"}
    ca = _pem(ca_secret, "tls.crt", tmp_path, "ca.crt")
    files: dict[str, TlsFiles] = {}
    for part, (name, settings, client_certs) in PARTS.items():
        secret = secrets[f"fedfaas-tls-{part}"]
        assert "annotations" not in secret["metadata"]  # signed again at every upgrade
        assert secret["data"]["ca.crt"] == ca_secret["data"]["tls.crt"]
        files[part] = TlsFiles(
            _pem(secret, "tls.crt", tmp_path, f"{part}.crt"),
            _pem(secret, "tls.key", tmp_path, f"{part}.key"),
            ca,
        )
        # the part's pods mount that Secret and serve HTTPS from it
        spec = _workload(docs, name)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["tls-secret"]["secret"]["secretName"] == f"fedfaas-tls-{part}"
        parsed, _ = settings.from_argv(spec["containers"][0]["args"])
        assert parsed.model_dump()["tls_client_certs"] == client_certs
    # no pod mounts the CA's key
    for d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for v in pod.get("volumes", []):
            assert v.get("secret", {}).get("secretName") != "fedfaas-tls-ca"
    # each part is verified by the name it is reached by; a gateway by the node it serves
    # (each of a node's perNode gateways), and not by an address
    engine, gateway = files["cache-engine"], files["node-gateway"]
    assert _handshake(engine, ca, "fedfaas-cache-engine.openfaas.svc", gateway) == "node-gateway"
    for name in ("n1", "n1-1", "n2", "n2-1", "fedfaas-node-gateway-peers.openfaas.svc"):
        assert _handshake(gateway, ca, name, files["control-plane"]) == "control-plane"
    for wrong in ("n3", "127.0.0.1", "fedfaas-control-plane"):
        with pytest.raises(ssl.SSLCertVerificationError):
            _handshake(gateway, ca, wrong)


def test_the_chart_makes_no_certificate_where_the_operator_or_cert_manager_does() -> None:
    for values in (
        ["--set", "tls.secretName=ops-tls"],
        ["--set", "tls.certManager.issuerRef.name=ca", "--api-versions", "cert-manager.io/v1"],
    ):
        docs = _render(*values)
        assert not [name for name in _secrets(docs) if "-tls-" in name], values


def test_the_gateways_internal_routes_take_the_control_planes_and_gateways_certificates() -> None:
    spec = _workload(_render(), "fedfaas-node-gateway")["spec"]["template"]["spec"]
    parsed, _ = GatewaySettings.from_argv(spec["containers"][0]["args"])
    assert parsed.tls_internal_names == "control-plane,node-gateway"
    spec = _workload(_render("--set", "tls.internalNames=null"), "fedfaas-node-gateway")
    args = spec["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-internal-names" not in args  # any certificate of the CA


def test_each_tls_part_serves_https_from_its_secret_copied_to_a_0600_key() -> None:
    docs = _render(*TLS, "--set", "tls.secretName=ops-tls")
    for part, (name, settings, client_certs) in PARTS.items():
        spec = _workload(docs, name)["spec"]["template"]["spec"]
        container = spec["containers"][0]
        # the part's own command line parser reads them as its TLS settings
        parsed, _ = settings.from_argv(container["args"])
        assert parsed.model_dump(include={"tls_cert_file", "tls_key_file", "tls_ca_file"}) == {
            "tls_cert_file": Path("/var/tls/tls.crt"),
            "tls_key_file": Path("/var/tls/tls.key"),
            "tls_ca_file": Path("/var/tls/ca.crt"),
        }
        assert parsed.model_dump()["tls_client_certs"] == client_certs
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["tls-secret"]["secret"]["secretName"] == f"ops-tls-{part}"
        assert volumes["tls-secret"]["secret"]["defaultMode"] == 0o440
        assert volumes["tls"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["tls"] == {"name": "tls", "mountPath": "/var/tls", "readOnly": True}
        assert "tls-secret" not in mounts  # the Secret: in the init container only
        (init,) = [c for c in spec["initContainers"] if c["name"] == "tls-files"]
        assert init["securityContext"]["runAsUser"] == container["securityContext"]["runAsUser"]
        probe = container["readinessProbe"]
        if client_certs == "required":  # kubelet presents no certificate
            assert probe == {"tcpSocket": {"port": "http"}, "periodSeconds": 5}
        else:
            assert probe["httpGet"]["scheme"] == "HTTPS"
    # the parts' URLs of each other are https; OpenFaaS's gateway stays as upstream serves it
    gateway = _env(
        _workload(docs, "fedfaas-node-gateway")["spec"]["template"]["spec"]["containers"][0]
    )
    tracker = _env(
        _workload(docs, "fedfaas-request-tracker")["spec"]["template"]["spec"]["containers"][0]
    )
    control = _env(
        _workload(docs, "fedfaas-control-plane")["spec"]["template"]["spec"]["containers"][0]
    )
    assert gateway["FEDFAAS_GATEWAY_ENGINE_URL"] == "https://fedfaas-cache-engine.openfaas:8091"
    assert tracker["FEDFAAS_TRACKER_ENGINE_URL"] == "https://fedfaas-cache-engine.openfaas:8091"
    assert control["FEDFAAS_CONTROL_TRACKER_URL"] == "https://fedfaas-request-tracker.openfaas:8092"
    assert control["FEDFAAS_CONTROL_PROVIDER_URL"] == "http://gateway.openfaas:8080"
    assert tracker["FEDFAAS_TRACKER_RUNTIME_URL"] == "http://gateway.openfaas:8080"


def test_the_ebpf_gateway_copies_its_files_as_root() -> None:
    docs = _render(*TLS, "--set", "nodeGateway.ebpf.enabled=true")
    spec = _workload(docs, "fedfaas-node-gateway")["spec"]["template"]["spec"]
    tls, folders = spec["initContainers"]
    assert tls["name"] == "tls-files" and tls["securityContext"]["runAsUser"] == 0
    # the folders an earlier gateway (uid 12000) left go to root (tests/platform/test_chart.py)
    assert folders["name"] == "node-folders" and folders["command"][:4] == [
        "chown",
        "-R",
        "-h",
        "0:0",
    ]


def test_the_init_containers_copy_passes_the_parts_key_check_where_the_secret_does_not(
    tmp_path: Path,
) -> None:
    """The rendered command, run here on files laid out as kubelet lays out a Secret volume
    under an fsGroup (0440): the parts refuse that key (others, the group, can read it) and
    take the copy."""
    docs = _render(*TLS)
    spec = _workload(docs, "fedfaas-control-plane")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    secret, copies = tmp_path / "secret", tmp_path / "copies"
    secret.mkdir()
    copies.mkdir()
    ca = mint_ca(tmp_path / "ca")
    part = mint_cert(ca, tmp_path / "ca", "control-plane", ["fedfaas-control-plane"])
    for src, name in ((part.cert, "tls.crt"), (part.key, "tls.key"), (ca.cert, "ca.crt")):
        (secret / name).write_bytes(src.read_bytes())
        (secret / name).chmod(0o440)
    with pytest.raises(TlsError, match="readable by others"):
        TlsFiles(secret / "tls.crt", secret / "tls.key", secret / "ca.crt").check()
    command = [a.replace("/var/tls-secret", str(secret)) for a in init["command"]]
    command = [a.replace("/var/tls/", f"{copies}/") for a in command]
    subprocess.run(command, check=True, timeout=30, env={"PATH": os.environ["PATH"]})
    files = TlsFiles(copies / "tls.crt", copies / "tls.key", copies / "ca.crt").check()
    assert (copies / "tls.key").stat().st_mode & 0o077 == 0
    assert files.server_context() is not None
    assert shlex.split(init["command"][2])[0:2] == ["umask", "077"]


def test_with_cert_manager_each_part_gets_a_certificate_for_its_names() -> None:
    values = [*TLS, "--set", "tls.certManager.issuerRef.name=fedfaas-ca"]
    refused = _helm(*values)
    assert refused.returncode != 0
    assert "does not serve cert-manager.io/v1" in refused.stderr, refused.stderr
    docs = _render(
        *values, "--api-versions", "cert-manager.io/v1",
        "--set", "nodeGateway.perNode=2",
        "--set", "tls.nodeGateway.nodeNames={n1,n2}",
        "--set", "tls.nodeGateway.ipAddresses={10.244.0.7}",
    )  # fmt: skip
    certs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert set(certs) == {f"fedfaas-tls-{p}" for p in PARTS}
    for name, spec in certs.items():
        assert spec["secretName"] == name
        assert spec["issuerRef"] == {
            "name": "fedfaas-ca",
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
        assert set(spec["usages"]) == {"digital signature", "server auth", "client auth"}
    gateway = certs["fedfaas-tls-node-gateway"]
    for name in ("n1", "n1-1", "n2", "n2-1", "fedfaas-node-gateway-peers.openfaas.svc"):
        assert name in gateway["dnsNames"], gateway
    assert gateway["ipAddresses"] == ["10.244.0.7"]
    assert "fedfaas-cache-engine.openfaas" in certs["fedfaas-tls-cache-engine"]["dnsNames"]
    assert "ipAddresses" not in certs["fedfaas-tls-control-plane"]


@pytest.mark.parametrize(
    "bad",
    ["tls.bogus=1", "tls.clientCerts.cacheEngine=sometimes", "tls.certManager.colour=red"],
)
def test_the_schema_refuses_bad_tls_values(bad: str) -> None:
    res = _helm(*TLS, "--set", bad)
    assert res.returncode != 0 and "values don't meet the specifications" in res.stderr, res.stderr


def _notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as helm renders it after an install (``helm template`` leaves it out, so a
    copy of the chart renders it into a ConfigMap)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_test.tpl").write_text(
        '{{- define "test.notes" -}}\n' + notes + "\n{{- end -}}\n"
    )
    (chart / "templates" / "notes-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ include "test.notes" . | quote }}\n'
    )
    res = _helm(*args, "--show-only", "templates/notes-test.yaml", chart=chart)
    assert res.returncode == 0, res.stderr
    return str(yaml.safe_load(res.stdout)["data"]["notes"])


def test_the_notes_say_whether_tls_is_on_and_where_its_files_come_from(tmp_path: Path) -> None:
    off = " ".join(_notes(tmp_path / "off", "--set", "tls.enabled=false").split())
    assert "TLS: off (tls.enabled=false). Every FedFaaS part speaks plain HTTP" in off
    made = " ".join(_notes(tmp_path / "default").split())
    assert "TLS: on." in made and "which this chart made, signed by its own CA" in made
    assert "in the Secret fedfaas-tls-ca (made once, kept on upgrade and uninstall)" in made
    assert "Whoever can read Secrets in namespace openfaas can read that CA's key" in made
    assert "restart the pods to take them" in made
    on = " ".join(_notes(tmp_path / "on", *TLS, "--set", "tls.secretName=ops").split())
    assert "TLS: on." in on and "from the Secrets ops-<part> (tls.crt, tls.key, ca.crt)" in on
    assert "which you make" in on and "signed by its own CA" not in on
    assert "get secret ops-control-plane -o jsonpath='{.data.ca\\.crt}'" in on
    assert "https://fedfaas-control-plane.openfaas.svc:8070" in on
