"""Fixtures of the Kubernetes tests: a control plane in a private namespace (module scope), helm
and faas-cli running inside it, and OpenFaaS (faas-netes + gateway) in front of it.

What they need: root (namespaces), ``unshare``/``nsenter``, helm (``make setup``), Debian's etcd
and kube-apiserver + kube-controller-manager (``make k8s-binaries``), and OpenFaaS's faas-netes,
gateway and faas-cli (``$FEDFAAS_OPENFAAS_BIN``). Where one is missing the tests skip, naming
it; under CI (``CI`` or ``FEDFAAS_OPENFAAS_BIN`` set) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.services import CACHE_DIR, find_binary
from tests.k8s.cluster import Cluster, binary, k8s_dir
from tests.k8s.faas_netes import OpenFaaSOnCluster, install_openfaas_objects
from tests.openfaas.conftest import BIN_ENV, FaasCli, require_binary, text, under_ci

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
#: the Node object the tests register by hand (no kubelet runs it)
NODE = "fedfaas-node-0"


def _missing(reason: str) -> None:
    if under_ci():
        pytest.fail(f"under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def k8s_binaries() -> dict[str, Path]:
    """etcd, kube-apiserver and kube-controller-manager (``make k8s-binaries``: built once,
    outside the tests, whose time limit a 10-minute build would overrun)."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        _missing("the Kubernetes tests need root, unshare and nsenter (private namespaces)")
    missing = [n for n in CONTROL_PLANE if binary(n) is None]
    if missing:
        _missing(
            f"{', '.join(missing)} missing from {k8s_dir()} (or etcd from PATH): "
            "run `make k8s-binaries`"
        )
    return {n: p for n in CONTROL_PLANE if (p := binary(n)) is not None}


@pytest.fixture(scope="session")
def faas_netes_binary() -> Path:
    """faas-netes, decompressed once from ``$FEDFAAS_OPENFAAS_BIN/faas-netes.xz`` into the
    cache (or ``faas-netes`` on PATH)."""
    folder = os.environ.get(BIN_ENV)
    packed = Path(folder) / "faas-netes.xz" if folder else None
    if packed is None or not packed.is_file():
        found = find_binary("faas-netes")
        if found:
            return Path(found)
        _missing(f"faas-netes: no faas-netes.xz in ${BIN_ENV} and no faas-netes on PATH")
        raise AssertionError("unreachable")
    target = CACHE_DIR / "bin" / "faas-netes"
    if not target.exists() or target.stat().st_mtime < packed.stat().st_mtime:
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(".part")
        with open(part, "wb") as out:
            subprocess.run(["xz", "-dc", str(packed)], stdout=out, check=True, timeout=120)
        part.chmod(0o755)
        part.rename(target)
    return target


@pytest.fixture(scope="module")
def cluster(
    k8s_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A started control plane with one hand-made Node, OpenFaaS's namespaces, faas-netes'
    RBAC and the ``basic-auth`` Secret; stopped (every process with its namespace) after."""
    folder = tmp_path_factory.mktemp("k8s")
    c = Cluster(folder, k8s_binaries)
    try:
        c.start()
        c.add_node(NODE)
        install_openfaas_objects(c, folder / "basic-auth")
        yield c
    finally:
        procs = list(c.procs.values())
        c.stop()
    assert not c.ns.alive(), "the namespace's init outlived stop()"
    assert all(p.poll() is not None for p in procs), "a process outlived its namespace"


@dataclass
class Helm:
    """helm inside the cluster's namespace, as its admin, with a HOME of its own."""

    binary: Path
    home: Path
    kubeconfig: Path

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run(
            [str(self.binary), *args],
            env=env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str) -> str:
        """Run and require exit status 0; the standard output."""
        res = self(*args)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        return res.stdout


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    found = find_binary("helm")
    if found is None:
        _missing("helm not installed: `make helm` builds it")
        raise AssertionError("unreachable")
    home = tmp_path_factory.mktemp("helm-home")
    return Helm(cluster.ns.wrapper("helm", found), home, cluster.admin_kubeconfig)


@pytest.fixture(scope="module")
def openfaas(
    cluster: Cluster,
    faas_netes_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OpenFaaSOnCluster]:
    """faas-netes, the real gateway and Prometheus inside the cluster's namespace."""
    gateway = require_binary("gateway")
    folder = tmp_path_factory.mktemp("openfaas")
    auth_dir = cluster.folder / "basic-auth"
    user = (auth_dir / "basic-auth-user").read_text()
    password = (auth_dir / "basic-auth-password").read_text()
    of = OpenFaaSOnCluster(cluster, (user, password), auth_dir, folder)
    of.start(faas_netes_binary, gateway)
    yield of  # its processes die with the cluster's namespace


@pytest.fixture()
def faas_cli(
    cluster: Cluster, openfaas: OpenFaaSOnCluster, tmp_path_factory: pytest.TempPathFactory
) -> FaasCli:
    """The real faas-cli inside the namespace, logged in to the gateway (HOME of its own)."""
    real = require_binary("faas-cli")
    cli = FaasCli(cluster.ns.wrapper("faas-cli", real), tmp_path_factory.mktemp("faas-cli-home"))
    cli.gateway = openfaas.url
    user, password = openfaas.auth
    out = cli("login", "--username", user, "--password-stdin", stdin=password)
    assert out.returncode == 0, text(out.stderr)
    return cli
