"""OpenFaaS's own gateway in front of the embedded runtime, as it fronts faas-netes or faasd.

The gateway (``$FEDFAAS_OPENFAAS_BIN/gateway``, built from upstream) takes the runtime as its
provider (``functions_provider_url``, basic auth from the runtime's own credential files) and
Debian's Prometheus scrapes the gateway's metrics (the gateway reads invocation counts back from
it; without one its ``GET /system/functions`` panics). Through the gateway: the real faas-cli
creates the function token secret, deploys, lists, describes, invokes and removes; FedFaaS's own
client (:class:`core.openfaas.OpenFaaS`) deploys, scales and reads replicas unchanged; the
cache engine's function creation path (an ``flstore-cache-0`` body from
:func:`core.openfaas.function_deployment`, then its ``/ping``) works; Prometheus has counted
the invocations (``gateway_function_invocation_total``).

The gateway's ports are fixed (:8080 API, :8082 metrics): where one is taken the tests skip,
or fail under CI, naming it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS, function_deployment
from core.services import PrometheusServer, http_ok, spawn, stop_group
from runtime import RuntimeProcess
from tests.openfaas.conftest import (
    GATEWAY_FIXED_PORTS,
    FaasCli,
    holding_fixed_ports,
    require_binary,
    text,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _gateway_fixed_ports() -> Iterator[None]:
    """The module starts OpenFaaS's gateway on its fixed ports: one such module at a time."""
    with holding_fixed_ports(GATEWAY_FIXED_PORTS, "OpenFaaS's gateway"):
        yield


REPO = Path(__file__).resolve().parents[2]
ECHO_DIR = REPO / "functions" / "echo"
FLSTORE_DIR = REPO / "functions" / "flstore"
TOKEN = "real-gateway-function-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
GATEWAY_PORT, METRICS_PORT = GATEWAY_FIXED_PORTS  # fixed in the gateway
GATEWAY = f"http://127.0.0.1:{GATEWAY_PORT}"

STACK = f"""\
version: 1.0
provider:
  name: openfaas
functions:
  gw-echo:
    lang: python3-http
    handler: {ECHO_DIR}
    image: fedfaas-conformance/echo:0.1.0
    secrets:
      - {FUNCTION_TOKEN_SECRET}
    annotations:
      com.fedfaas.handler: {ECHO_DIR}
"""

#: what the gateway logs for each request it forwards to its provider
FORWARDED = re.compile(r"Forwarded \[(?P<method>[A-Z]+)\] to (?P<path>\S+) - \[(?P<code>\d+)\]")


@dataclass
class RealGateway:
    url: str
    runtime: RuntimeProcess
    prometheus: PrometheusServer
    log_path: Path


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: connections in TIME_WAIT do not count, a listener does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def real_gateway(
    prometheus_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealGateway]:
    """Prometheus (scraping :8082), the runtime (in its provider role: ``behind_gateway``), and
    the real gateway on :8080 in front of it; all stopped at the end."""
    binary = require_binary("gateway")
    folder = tmp_path_factory.mktemp("real-gateway")
    prometheus = PrometheusServer(
        data_dir=folder / "prometheus", targets=[f"127.0.0.1:{METRICS_PORT}"]
    ).start()
    rt = RuntimeProcess(state_dir=folder / "runtime", settings={"behind_gateway": True}).start()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "functions_provider_url": f"{rt.url}/",
        "basic_auth": "true",
        "secret_mount_path": str(rt.auth_dir),
        "scale_from_zero": "true",
        "faas_prometheus_host": prometheus.host,
        "faas_prometheus_port": str(prometheus.port),
        "read_timeout": "65s",
        "write_timeout": "65s",
        "upstream_timeout": "60s",
    }
    log_path = folder / "gateway.log"
    proc = spawn([str(binary)], log_path=log_path, env=env, cwd=folder)
    try:
        wait_for(lambda: proc.poll() is None and http_ok(f"{GATEWAY}/healthz"), "gateway up")
        yield RealGateway(GATEWAY, rt, prometheus, log_path)
    finally:
        stop_group(proc, 10)
        prometheus.stop()
        rt.stop()
    assert not _port_taken(GATEWAY_PORT) and not _port_taken(METRICS_PORT)
    assert not prometheus.ready()


def _client(gw: RealGateway) -> OpenFaaS:
    return OpenFaaS(gw.url, gw.runtime.auth, timeout=60)


def test_prometheus_scrapes_the_gateway(real_gateway: RealGateway) -> None:
    prom = real_gateway.prometheus
    assert prom.ready()

    def scraped() -> bool:
        up = prom.query('up{job="fedfaas"}')
        return bool(up) and up[0]["value"][1] == "1"

    wait_for(scraped, "prometheus scraped the gateway's :8082")


def test_gateway_names_the_provider(real_gateway: RealGateway) -> None:
    r = httpx.get(f"{real_gateway.url}/system/info", auth=real_gateway.runtime.auth, timeout=10)
    assert r.status_code == 200, r.text
    provider = r.json()["provider"]
    assert (provider["provider"], provider["orchestration"]) == ("fedfaas-runtime", "process")


def test_gateway_refuses_system_calls_without_the_runtime_credentials(
    real_gateway: RealGateway,
) -> None:
    """The gateway checks the runtime's basic-auth files itself (``secret_mount_path``)."""
    for auth in (None, (real_gateway.runtime.auth[0], "wrong-password")):
        r = httpx.get(f"{real_gateway.url}/system/functions", auth=auth, timeout=10)
        assert r.status_code == 401, (auth, r.status_code, r.text)
    r = httpx.get(f"{real_gateway.url}/system/functions", auth=real_gateway.runtime.auth)
    assert r.status_code == 200 and isinstance(r.json(), list), r.text


def test_faas_cli_through_the_real_gateway(
    real_gateway: RealGateway, faas_cli: FaasCli, tmp_path: Path
) -> None:
    gw = real_gateway
    faas_cli.gateway = gw.url
    user, password = gw.runtime.auth
    stack = tmp_path / "stack.yml"
    stack.write_text(STACK)

    bad = faas_cli("login", "-u", user, "--password-stdin", stdin="wrong-password")
    assert bad.returncode != 0
    faas_cli.ok("login", "-u", user, "--password-stdin", stdin=password)

    version = faas_cli.ok("version", "--warn-update=false")
    assert re.search(r"Gateway\s+uri:\s+" + re.escape(gw.url), version), version
    # the provider's version comes through; its name does not (see test_gateway_names_the_provider)
    assert re.search(r"Provider\n.*\n.*\n\s+version:\s+\d", version), version

    # the gateway proxies /system/secrets to its provider: the secret lands in the runtime
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    faas_cli.ok("secret", "create", FUNCTION_TOKEN_SECRET, "--from-file", str(tmp_path / "token"))
    assert (gw.runtime.state_dir / "secrets" / FUNCTION_TOKEN_SECRET).read_text() == TOKEN
    assert FUNCTION_TOKEN_SECRET in faas_cli.ok("secret", "list").split()

    deployed = faas_cli.ok("deploy", "-f", str(stack), cwd=REPO)
    assert "Deployed. 202 Accepted." in deployed, deployed
    assert f"URL: {gw.url}/function/gw-echo" in deployed
    assert "is ready" in faas_cli.ok("ready", "gw-echo", "--interval", "200ms", "--attempts", "300")

    rows = {line.split()[0]: line.split() for line in faas_cli.ok("list").splitlines()[1:]}
    assert rows["gw-echo"][2] == "1", rows  # replicas
    described = faas_cli.ok("describe", "gw-echo")
    for want in (r"Name:\s+gw-echo", r"Status:\s+Ready", r"Available Replicas:\s+1"):
        assert re.search(want, described), (want, described)

    out = faas_cli("invoke", "gw-echo", stdin=b"no token")
    assert out.returncode != 0 and "401" in text(out.stdout + out.stderr)
    body = bytes(range(256)) * 16
    for _ in range(3):
        out = faas_cli(
            "invoke",
            "gw-echo",
            "-H",
            f"Authorization: Bearer {TOKEN}",
            "--content-type",
            "application/octet-stream",
            stdin=body,
        )
        assert out.returncode == 0 and out.stdout == body, text(out.stderr)

    # the gateway counts the invocations (every status code) and Prometheus has them
    def counted() -> bool:
        # faas-cli calls /function/gw-echo.openfaas-fn: the gateway labels it with the namespace
        rows = gw.prometheus.query(
            'sum(gateway_function_invocation_total{function_name="gw-echo.openfaas-fn"})'
        )
        return bool(rows) and float(rows[0]["value"][1]) >= 4

    wait_for(counted, "prometheus counted gw-echo's 4 invocations", timeout=60)
    # ... and faas-cli shows the count, which the gateway read back from Prometheus
    wait_for(
        lambda: re.search(r"Invocations:\s+4\b", faas_cli.ok("describe", "gw-echo")) is not None,
        "faas-cli describe shows 4 invocations",
    )

    faas_cli.ok("remove", "gw-echo")
    wait_for(lambda: "gw-echo" not in faas_cli.ok("list"), "gw-echo removed")


def test_fedfaas_client_through_the_real_gateway(real_gateway: RealGateway) -> None:
    """``OpenFaaS`` deploys, scales (``/system/scale-function``) and reads replicas through
    the gateway exactly as through the runtime."""
    with _client(real_gateway) as of:
        assert of.healthz()
        of.set_secret(FUNCTION_TOKEN_SECRET, TOKEN)
        body = function_deployment(
            "gw-client-echo",
            "fedfaas-conformance/echo:0.1.0",
            handler_dir=ECHO_DIR,
            secrets=[FUNCTION_TOKEN_SECRET],
            labels={"com.openfaas.scale.max": "3"},
        )
        res = of.deploy(body)
        assert res.ok, res
        try:
            wait_for(
                lambda: (
                    (st := of.function("gw-client-echo")) is not None and st.available_replicas >= 1
                ),
                "gw-client-echo ready",
                timeout=60,
            )
            assert "gw-client-echo" in {f["name"] for f in of.list_functions()}
            of.scale("gw-client-echo", 2)
            wait_for(
                lambda: (
                    (st := of.function("gw-client-echo")) is not None
                    and st.replicas == 2
                    and st.available_replicas == 2
                ),
                "gw-client-echo at 2 replicas",
                timeout=60,
            )
            seen = set()
            for _ in range(20):
                r = of.invoke("gw-client-echo", method="GET", path="/who", headers=BEARER)
                assert r.status_code == 200, r.text
                seen.add(r.json()["replica"])
            assert len(seen) == 2, seen  # both replicas answered
            assert of.invoke("gw-client-echo", b"x").status_code == 401

            # the runtime clamps a scale request to [1, scale.max] (it has no scale to zero, so
            # the gateway's scale_from_zero never finds a function at 0): 0 gives 1 replica
            of.scale("gw-client-echo", 0)
            wait_for(
                lambda: (
                    (st := of.function("gw-client-echo")) is not None
                    and st.replicas == 1
                    and st.available_replicas == 1
                ),
                "gw-client-echo back at 1 replica",
                timeout=60,
            )
            r = of.invoke("gw-client-echo", b"still here", headers=BEARER)
            assert r.status_code == 200 and r.content == b"still here", r.text
        finally:
            assert of.remove("gw-client-echo")
        assert of.function("gw-client-echo") is None


def test_cache_function_creation_through_the_real_gateway(real_gateway: RealGateway) -> None:
    """The cache engine's path: ``function_deployment`` of ``flstore-cache-0`` as
    ``cache_engine.engine`` builds it, ``OpenFaaS.deploy``, then ``GET /ping`` through
    ``/function/flstore-cache-0/ping``."""
    with _client(real_gateway) as of:
        of.set_secret(FUNCTION_TOKEN_SECRET, TOKEN)
        body = function_deployment(
            "flstore-cache-0",
            "fedfaas/flstore-cache:latest",
            env={
                "FEDFAAS_FLSTORE_MINIO_ENDPOINT": "127.0.0.1:9",
                "FEDFAAS_FLSTORE_BUCKET": "fedfaas",
                "FEDFAAS_FLSTORE_CAPACITY_BYTES": str(64 << 20),
            },
            labels={"com.fedfaas.role": "flstore-cache"},
            handler_dir=FLSTORE_DIR,
            secrets=[FUNCTION_TOKEN_SECRET],
        )
        assert of.deploy(body).ok
        try:

            def ping() -> httpx.Response | None:
                r = of.invoke("flstore-cache-0", method="GET", path="/ping", headers=BEARER)
                return r if r.status_code == 200 else None

            wait_for(lambda: ping() is not None, "flstore-cache-0 answers /ping", timeout=90)
            pong = ping()
            assert pong is not None
            doc = pong.json()
            assert isinstance(doc, dict) and doc, doc
            labels = of.function("flstore-cache-0")
            assert labels is not None
        finally:
            of.remove("flstore-cache-0")


def forwarded_routes(log_path: Path) -> dict[str, set[str]]:
    """``METHOD /path`` (function names as ``{name}``, no query) -> the status codes the
    gateway logged for the requests it forwarded to the runtime."""
    routes: dict[str, set[str]] = {}
    for m in FORWARDED.finditer(log_path.read_text()):
        path = m["path"].split("?")[0]
        path = re.sub(r"^/function/[^/]+", "/function/{name}", path)
        path = re.sub(r"^/system/(function|scale-function)/[^/]+", r"/system/\1/{name}", path)
        routes.setdefault(f"{m['method']} {path}", set()).add(m["code"])
    return routes


def test_routes_exercised(real_gateway: RealGateway) -> None:
    """The routes the tests above sent through the gateway to the runtime (run in file order),
    as the gateway logged them, each with the status codes it saw."""
    routes = forwarded_routes(real_gateway.log_path)
    print(f"\ngateway routes forwarded ({len(routes)}):")
    for route, codes in sorted(routes.items()):
        print(f"  {route}: {sorted(codes)}")
    want = {
        "GET /healthz": {"200"},
        "GET /system/info": {"200"},
        "GET /system/functions": {"200"},
        "POST /system/functions": {"202"},
        "PUT /system/functions": {"404"},
        "DELETE /system/functions": {"202"},
        "GET /system/function/{name}": {"200", "404"},
        "POST /system/scale-function/{name}": {"202"},
        "GET /system/secrets": {"200"},
        "POST /system/secrets": {"202", "409"},
        "PUT /system/secrets": {"202"},
        "POST /function/{name}": {"200", "401"},
        "GET /function/{name}/who": {"200"},
        "GET /function/{name}/ping": {"200"},
    }
    missing = {r: c - routes.get(r, set()) for r, c in want.items() if c - routes.get(r, set())}
    assert not missing, (missing, routes)
