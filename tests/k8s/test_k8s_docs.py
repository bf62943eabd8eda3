"""docs/openfaas-kubernetes.md's "What ran here" names what the Kubernetes tier runs: the versions
the tests start and every test module of a real node, each of which exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

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
