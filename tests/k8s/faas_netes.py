"""OpenFaaS on the test cluster, as OpenFaaS's own manifests set it up: the namespaces and
faas-netes' service account and Role (``openfaas.yaml``, copied from faas-netes), the
``basic-auth`` Secret (as OpenFaaS's chart makes it), then faas-netes, the real gateway and
Prometheus as processes inside the cluster's namespace, with the environment of faas-netes'
``yaml/gateway-dep.yml``.

faas-netes talks to the API server with a token of the ``openfaas-controller`` service account
(the TokenRequest API, in a kubeconfig): it has exactly the permissions OpenFaaS grants it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import httpx
import yaml

from core.services import PrometheusServer
from tests.k8s.api import KubeApi
from tests.k8s.cluster import SERVER, Cluster
from tests.k8s.netns import NODE_IP
from tests.openfaas.conftest import wait_for

MANIFESTS = Path(__file__).with_name("openfaas.yaml")
FUNCTION_NAMESPACE = "openfaas-fn"
GATEWAY_PORT = 8080  # fixed in the gateway
METRICS_PORT = 8082  # fixed in the gateway
PROVIDER_PORT = 8081  # faas-netes' port in OpenFaaS's manifests
PROMETHEUS_PORT = 9090
GATEWAY = f"http://127.0.0.1:{GATEWAY_PORT}"
#: the timeouts of OpenFaaS's manifests
_TIMEOUTS = {"read_timeout": "1m05s", "write_timeout": "1m05s"}


def install_openfaas_objects(cluster: Cluster, auth_dir: Path) -> tuple[str, str]:
    """Create OpenFaaS's namespaces, faas-netes' RBAC and the ``basic-auth`` Secret (user
    ``admin``, a random password); the credentials, also written as files into ``auth_dir``
    (``basic-auth-user``, ``basic-auth-password``: where the gateway and faas-netes read them,
    as from the mounted Secret)."""
    for doc in yaml.safe_load_all(MANIFESTS.read_text()):
        if doc:
            cluster.api.create(doc)
    user, password = "admin", secrets.token_urlsafe(16)
    cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "basic-auth",
                "namespace": "openfaas",
                "labels": {"app": "openfaas", "component": "gateway"},
            },
            "stringData": {"basic-auth-user": user, "basic-auth-password": password},
        }
    )
    auth_dir.mkdir(parents=True, exist_ok=True)
    auth_dir.chmod(0o700)
    for name, value in (("basic-auth-user", user), ("basic-auth-password", password)):
        path = auth_dir / name
        path.touch(mode=0o600)
        path.write_text(value)
    return user, password


@dataclass
class OpenFaaSOnCluster:
    """faas-netes, the gateway and Prometheus running inside the cluster's namespace."""

    cluster: Cluster
    auth: tuple[str, str]
    auth_dir: Path
    folder: Path
    procs: dict[str, Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The gateway, as seen from inside the namespace."""
        return GATEWAY

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def http(self, method: str, path: str, **kw: object) -> httpx.Response:
        """A request to the gateway with its basic auth, from inside the namespace."""

        def go() -> httpx.Response:
            with httpx.Client(base_url=GATEWAY, auth=self.auth, timeout=30) as c:
                return c.request(method, path, **kw)  # type: ignore[arg-type]

        return self.cluster.ns.call(go)

    def _healthy(self, name: str, url: str) -> bool:
        if self.procs[name].poll() is not None:
            raise AssertionError(f"{name} exited: {self.log(name)}")

        def go() -> bool:
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        return self.cluster.ns.call(go)

    def start(self, faas_netes: Path, gateway: Path, timeout: float = 60.0) -> None:
        """Start Prometheus, faas-netes and the gateway; return once both answer /healthz."""
        ns = self.cluster.ns
        self.folder.mkdir(parents=True, exist_ok=True)
        token = self.cluster.api.service_account_token("openfaas", "openfaas-controller")
        kubeconfig = self.cluster.pki.kubeconfig("faas-netes", SERVER, token=token)
        prometheus = PrometheusServer(
            data_dir=self.folder / "prometheus",
            port=PROMETHEUS_PORT,
            targets=[f"127.0.0.1:{METRICS_PORT}"],
        )
        prometheus.prepare()
        self.procs["prometheus"] = ns.spawn(
            prometheus.command(), self.folder / "prometheus.log", cwd=self.folder
        )
        auth = {"basic_auth": "true", "secret_mount_path": str(self.auth_dir)}
        provider_env = {
            "PATH": "/usr/bin:/bin",
            "port": str(PROVIDER_PORT),
            "function_namespace": FUNCTION_NAMESPACE,
            "profiles_namespace": "openfaas",
            "image_pull_policy": "Always",
            "http_probe": "true",
            "set_nonroot_user": "false",
            "cluster_role": "false",
            **_TIMEOUTS,
            **auth,
        }
        self.procs["faas-netes"] = ns.spawn(
            [str(faas_netes), f"-kubeconfig={kubeconfig}", "-operator=false"],
            self.folder / "faas-netes.log",
            env=provider_env,
            cwd=self.folder,
        )
        gateway_env = {
            "PATH": "/usr/bin:/bin",
            "upstream_timeout": "1m",
            "functions_provider_url": f"http://127.0.0.1:{PROVIDER_PORT}/",
            "direct_functions": "false",
            "direct_functions_suffix": f"{FUNCTION_NAMESPACE}.svc.cluster.local",
            "function_namespace": FUNCTION_NAMESPACE,
            "scale_from_zero": "true",
            "probe_functions": "false",
            "faas_prometheus_host": "127.0.0.1",
            "faas_prometheus_port": str(PROMETHEUS_PORT),
            **_TIMEOUTS,
            **auth,
        }
        self.procs["gateway"] = ns.spawn(
            [str(gateway)], self.folder / "gateway.log", env=gateway_env, cwd=self.folder
        )
        provider = f"http://127.0.0.1:{PROVIDER_PORT}/healthz"
        wait_for(lambda: self._healthy("faas-netes", provider), "faas-netes /healthz", timeout)
        wait_for(lambda: self._healthy("gateway", f"{GATEWAY}/healthz"), "gateway", timeout)


def keep_imported_images(api: KubeApi) -> list[str]:
    """Patch every function Deployment whose containers pull ``Always`` to ``IfNotPresent``;
    the names patched.

    faas-netes' last MIT build gives every function it makes `imagePullPolicy: Always` whatever
    its ``image_pull_policy`` says, and no registry answers on a test node: the functions run the
    images imported into containerd instead (the cache engine's flstore-cache-N, faas-cli's).
    """
    patched = []
    for dep in api.list("apps/v1", "Deployment", FUNCTION_NAMESPACE):
        containers = dep["spec"]["template"]["spec"]["containers"]
        if all(c.get("imagePullPolicy") != "Always" for c in containers):
            continue
        name = dep["metadata"]["name"]
        patch = {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": c["name"], "imagePullPolicy": "IfNotPresent"}
                            for c in containers
                        ]
                    }
                }
            }
        }
        res = api.send(  # a 429 sent again (a 5xx of a write never is)
            "PATCH",
            api.resource("apps/v1", "Deployment").path(FUNCTION_NAMESPACE, name),
            json=patch,
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        if res.status_code == 404:
            continue  # removed (faas-cli remove) since the list above
        res.raise_for_status()
        patched.append(name)
    return patched


def publish_gateway(cluster: Cluster) -> None:
    """The Service ``gateway`` in ``openfaas`` (the chart's default ``gatewayURL``,
    ``http://gateway.openfaas:8080``, as OpenFaaS's chart names it) for the gateway process:
    no selector, one EndpointSlice naming the node's address, so pods reach it through
    kube-proxy as they would the gateway's pods."""
    cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "gateway", "namespace": "openfaas"},
            "spec": {"ports": [{"name": "http", "port": GATEWAY_PORT, "protocol": "TCP"}]},
        }
    )
    cluster.api.create(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "gateway-process",
                "namespace": "openfaas",
                "labels": {"kubernetes.io/service-name": "gateway"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": GATEWAY_PORT, "protocol": "TCP"}],
        }
    )
