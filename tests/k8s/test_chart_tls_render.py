"""The chart's TLS values as ``helm template`` renders them (values ``tls``, templates/_helpers.tpl,
templates/tls-certificates.yaml): what each TLS part's pod gets, that TLS is off by default,
cert-manager's Certificates, and the schema's refusals. On a real node and API server:
test_chart_on_node.py (TLS from Secrets) and test_chart_on_apiserver.py (cert-manager's CRDs).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
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


def test_tls_is_off_by_default_and_nothing_of_it_is_rendered() -> None:
    docs = _render()
    assert not [d for d in docs if d["kind"] == "Certificate"]
    for name, _, _ in PARTS.values():
        spec = _workload(docs, name)["spec"]["template"]["spec"]
        assert "tls-files" not in [c["name"] for c in spec.get("initContainers", [])]
        assert not [a for a in spec["containers"][0]["args"] if a.startswith("--tls")]
        assert not [k for k in _env(spec["containers"][0]) if "TLS" in k]
        assert "scheme" not in spec["containers"][0]["readinessProbe"]["httpGet"]


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
    (init,) = spec["initContainers"]  # root owns the hostPath folders: no node-folders step
    assert init["name"] == "tls-files" and init["securityContext"]["runAsUser"] == 0


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
    off = " ".join(_notes(tmp_path / "off").split())
    assert "TLS: off. Every FedFaaS part speaks plain HTTP" in off
    assert "--set tls.enabled=true and the Secrets fedfaas-tls-<part>" in off
    on = " ".join(_notes(tmp_path / "on", *TLS, "--set", "tls.secretName=ops").split())
    assert "TLS: on." in on and "from the Secrets ops-<part> (tls.crt, tls.key, ca.crt)" in on
    assert "https://fedfaas-control-plane.openfaas.svc:8070" in on
