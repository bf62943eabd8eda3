"""docs/openfaas-kubernetes.md's "What ran here" names what the Kubernetes tier runs: the versions
the tests start and every test module of a real node, each of which exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.k8s.cluster import K8S_VERSION
from tests.k8s.node import COREDNS_IMAGE

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "openfaas-kubernetes.md"


def _what_ran() -> str:
    text = DOC.read_text()
    start = text.index("**What ran here**")
    return text[start : text.index("**Not run here**", start)]


def test_the_section_names_the_versions_the_tests_run() -> None:
    section = " ".join(_what_ran().split())
    assert f"Kubernetes {K8S_VERSION}" in section
    assert f"CoreDNS {COREDNS_IMAGE.rsplit(':', 1)[1]}" in section
    for tool, pattern in (("containerd", r"containerd (\d+\.\d+)"), ("etcd", r"etcd (\d+\.\d+)")):
        if shutil.which(tool) is None:
            continue  # the tier itself says it is missing
        named = re.search(pattern, section)
        assert named is not None, tool
        out = subprocess.run(
            [tool, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        assert re.search(rf"\b{re.escape(named.group(1))}\.\d+", out), (tool, out)


def test_the_section_names_every_node_test_module_and_only_existing_ones() -> None:
    section = _what_ran()
    named = set(re.findall(r"`(tests/k8s/test_\w+\.py)`", section))
    assert named and all((REPO / path).is_file() for path in named), named
    on_a_node = {
        f"tests/k8s/{p.name}"
        for p in (REPO / "tests" / "k8s").glob("test_*.py")
        if p.name != Path(__file__).name and "started_node" in p.read_text()
    }
    assert on_a_node <= named, on_a_node - named


def _readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## On Kubernetes")
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def test_the_readme_names_the_versions_and_what_ran_with_the_tests_that_ran_it() -> None:
    section = _readme_section()
    assert f"Kubernetes {K8S_VERSION}" in section
    assert f"CoreDNS {COREDNS_IMAGE.rsplit(':', 1)[1]}" in section
    named = re.search(r"containerd (\d+\.\d+)", section)
    assert named is not None and f"containerd {named.group(1)}" in " ".join(_what_ran().split())
    tests = (REPO / "tests" / "k8s" / "test_job_on_node.py").read_text()
    for claim, test in (
        ("8 clients over two node gateway pods", "def test_a_readme_job_runs_on_two_gateway_pods"),
        ("scaling `aggregator` up", "def test_the_control_plane_scales_the_aggregator_for"),
        ("a gateway pod deleted mid-round", "def test_a_root_gateway_pod_deleted_mid_round"),
    ):
        assert claim in section and test in tests, claim
    # "over HTTPS, the chart's default": the release of those tests sets nothing of tls
    assert "over HTTPS, the chart's default" in section
    values = yaml.safe_load((REPO / "charts/fedfaas/values.yaml").read_text())
    assert values["tls"]["enabled"] is True and "tls.enabled" not in tests
    assert "# TLS: the default" in tests
    issued = (REPO / "tests" / "k8s" / "test_chart_cert_manager.py").read_text()
    assert "cert-manager v1.19.2's controller loops" in section
    assert "def test_a_job_through_the_sdk_over_https_with_the_issuers_ca_is_exact_fedavg" in issued


def _values_paths(doc: dict[str, object], prefix: str = "") -> set[str]:
    out = set()
    for key, value in doc.items():
        path = f"{prefix}{key}"
        out.add(path)
        if isinstance(value, dict):
            out |= _values_paths(value, f"{path}.")
    return out


def test_the_tls_docs_name_values_secrets_versions_and_tests_that_exist() -> None:
    """The chart's TLS as docs/openfaas-kubernetes.md and the chart's README tell it: every
    ``tls.*`` value they name is in values.yaml, the Secrets' parts are the chart's and the
    tests', the cert-manager version is the one the script fetches, and the claims of what ran
    are in the tests named."""
    import yaml

    from tests.k8s import chart_tls

    values = _values_paths(yaml.safe_load((REPO / "charts/fedfaas/values.yaml").read_text()))
    doc = DOC.read_text()
    tls = doc[doc.index("**TLS**") : doc.index("**What ran here**")]
    readme = (REPO / "charts/fedfaas/README.md").read_text()
    section = readme[readme.index("## TLS") : readme.index("## Values worth knowing")]
    named = set(re.findall(r"`(tls\.[\w.]+)", tls + section)) - {"tls.crt", "tls.key"}  # keys
    assert {"tls.enabled", "tls.secretName", "tls.certManager.issuerRef.name"} <= named
    assert named <= values, named - values
    parts = set(re.findall(r"`<prefix>-([\w-]+)`", section))
    assert parts == set(chart_tls.PARTS), parts
    script = (REPO / "scripts/cert-manager-crds.sh").read_text()
    version = re.search(r"FEDFAAS_CERT_MANAGER_VERSION:-(v[\d.]+)", script)
    assert version is not None and f"CRDs ({version[1]}," in " ".join(_what_ran().split())
    node = (REPO / "tests/k8s/test_chart_on_node.py").read_text()
    apiserver = (REPO / "tests/k8s/test_chart_on_apiserver.py").read_text()
    for claim, test, source in (
        ("with TLS from Secrets", "chart_tls.create_secrets(", node),
        (
            "a job through the SDK over HTTPS with `ca_file`",
            "def test_a_job_through_the_sdk_over_https",
            node,
        ),
        ("answered `400 tls_required`", "def test_plain_http_and_another_cas_certificate", node),
        (
            "cert-manager's own CRDs",
            "def test_with_cert_manager_the_chart_makes_a_certificate",
            apiserver,
        ),
    ):
        assert claim in " ".join(_what_ran().split()) and test in source, claim


def test_the_default_tls_docs_say_what_values_yaml_and_the_templates_do() -> None:
    """The chart's README says TLS is on by default from a CA the chart generates, with the
    values' defaults (validity days, internal names) and the CA Secret's name the templates
    use; docs/openfaas-kubernetes.md says the same; the NOTES say where the CA is."""
    import yaml

    values = yaml.safe_load((REPO / "charts/fedfaas/values.yaml").read_text())["tls"]
    readme = (REPO / "charts/fedfaas/README.md").read_text()
    section = " ".join(readme[readme.index("## TLS") : readme.index("## Values worth")].split())
    assert values["enabled"] is True and "TLS is on by default (`tls.enabled: true`" in section
    generated = values["generated"]
    assert f"`tls.generated.caDays`, {generated['caDays']} days" in section
    assert f"`tls.generated.certDays`, {generated['certDays']} days" in section
    assert values["internalNames"] == ["control-plane", "node-gateway"]
    assert "default `control-plane` and `node-gateway`" in section
    helpers = (REPO / "charts/fedfaas/templates/_helpers.tpl").read_text()
    assert 'printf "%s-tls-ca" (include "fedfaas.fullname" .)' in helpers
    assert "Secret `<release>-tls-ca` (`tls.crt`, `tls.key`), kept on upgrade and uninstall" in (
        section
    )
    template = (REPO / "charts/fedfaas/templates/tls-generated.yaml").read_text()
    assert "genCA" in template and "genSignedCert" in template and "lookup" in template
    doc = DOC.read_text()
    tls = " ".join(doc[doc.index("**TLS**") : doc.index("**What ran here**")].split())
    assert "(`tls.enabled`, on by default;" in tls and "`<release>-tls-ca`" in tls


def test_the_install_snippet_fetches_the_ca_from_the_secret_the_chart_makes() -> None:
    """The install commands end with the CA the SDK takes, from the control plane's Secret of
    the release ``fedfaas`` (templates/_helpers.tpl's prefix, tls-generated.yaml's Secrets)."""
    from tests.docs.snippets import command_lines, snippet

    lines = command_lines(snippet("openfaas-kubernetes").text)
    kubectl = next(line for line in lines if line.startswith("kubectl "))
    assert "get secret fedfaas-tls-control-plane" in kubectl and "{.data.ca\\.crt}" in kubectl
    helpers = (REPO / "charts/fedfaas/templates/_helpers.tpl").read_text()
    assert '(printf "%s-tls" (include "fedfaas.fullname" .))' in helpers
    assert (
        'include "fedfaas.tlsSecret" (dict "ctx" $ "part" $part)'
        in (REPO / "charts/fedfaas/templates/tls-generated.yaml").read_text()
    )


def test_the_default_tls_claims_of_what_ran_are_in_the_job_module() -> None:
    section = " ".join(_what_ran().split())
    tests = (REPO / "tests/k8s/test_job_on_node.py").read_text()
    for claim, test in (
        (
            "the chart with its default TLS",
            'install(node, tmp_path_factory.mktemp("helm-home"), *VALUES)',
        ),
        (
            "`403 client_certificate_required` on a gateway's peer-partial route",
            "def test_the_default_tls_refuses_plain_http_another_ca_and_the_engines",
        ),
        ("each verified against the node name the control plane gives", "tls_name=a.get("),
    ):
        assert claim in section, claim
        assert test in tests or test in (REPO / "tests/containers/faasd_job.py").read_text(), test
    assert "tls.enabled" not in tests  # the default, not a value the test sets
