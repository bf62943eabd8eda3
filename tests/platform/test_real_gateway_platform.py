"""``fedfaas up --with all --openfaas-gateway PATH``: OpenFaaS's own gateway (and a Prometheus)
in front of the runtime, the cache engine, request tracker and control plane pointed at it; one
small FL job runs through the platform and the gateway forwarded the components' calls: the
control plane's on the ``aggregator``, the cache engine's deploy of ``flstore-cache-N`` and its
``/load`` (slow: the whole platform, `make test-slow`).

In the default tier, :func:`test_with_the_gateway_every_component_reaches_functions_through_it`
holds the wiring (which URL each part is given) and ``tests/openfaas/test_real_gateway.py`` the
calls themselves through the real gateway: the provider named, the credentials required, the
OpenFaaS client's deploy/scale/invoke (the control plane's path), the cache engine's deploy of
``flstore-cache-0``, Prometheus scraping it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedfaas.platform import openfaas_gateway as gateway_parts
from fedfaas.platform import optional, parts
from fedfaas.platform.context import Context
from fedfaas.platform.errors import PlatformError
from fedfaas.platform.orchestrator import Platform as OrchestratedPlatform
from fedfaas.platform.parts import PortSpec, ServiceSpec
from fedfaas.settings import PlatformSettings
from tests.openfaas.conftest import (
    GATEWAY_FIXED_PORTS,
    holding_fixed_ports,
    require_binary,
    require_free_port,
    require_prometheus,
)
from tests.platform.running import any_ports_env, running_platform
from tests.platform.test_one_platform import (
    Platform,
    assert_fedavg,
    run_round,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _gateway_fixed_ports() -> Iterator[None]:
    """The module starts OpenFaaS's gateway on its fixed ports: one such module at a time."""
    with holding_fixed_ports(GATEWAY_FIXED_PORTS, "OpenFaaS's gateway"):
        yield


FORWARDED = re.compile(r"Forwarded \[(?P<method>[A-Z]+)\] to (?P<path>\S+) - \[(?P<code>\d+)\]")


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    binary = require_binary("gateway")
    require_prometheus()
    state_dir = tmp_path_factory.mktemp("real-gateway-platform") / "state"
    args = ("--with", "all", "--openfaas-gateway", str(binary))
    with running_platform(state_dir, *args, env=any_ports_env(), timeout=300) as st:
        yield Platform(state_dir, {name: f"http://{st.host}:{p}" for name, p in st.ports.items()})
    assert http_down("http://127.0.0.1:8080/healthz")


def http_down(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return True
    return False


def forwarded(p: Platform) -> list[tuple[str, str, str]]:
    """(method, path, status) of each request the gateway forwarded to the runtime."""
    text = (p.state_dir / "logs" / "openfaas-gateway.log").read_text()
    return [(m["method"], m["path"], m["code"]) for m in FORWARDED.finditer(text)]


# the port tests first: the module's platform, once up, holds :8080 until the module ends
def test_the_gateway_takes_its_fixed_ports_before_the_runtime_takes_its_usual_8080(
    tmp_path: Path,
) -> None:
    for port in (8080, 8082):
        require_free_port(port, "OpenFaaS's gateway")
    settings = PlatformSettings(state_dir=tmp_path)  # the runtime's usual port is 8080
    ports = OrchestratedPlatform(settings, openfaas_gateway=Path("gateway"))._choose_ports()
    assert (ports["openfaas_gateway"], ports["openfaas_gateway_metrics"]) == (8080, 8082)
    assert ports["runtime"] not in (8080, 8082)
    assert len(set(ports.values())) == len(ports)


def test_a_fixed_port_that_is_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        part = ServiceSpec(
            name="fixed-thing",
            ports=(PortSpec("fixed_thing", taken, fixed=True),),
            argv=lambda ctx: [],
            ready=lambda ctx: True,
            address=lambda ctx: "",
        )
        platform = OrchestratedPlatform(PlatformSettings(state_dir=tmp_path), parts=[part])
        with pytest.raises(PlatformError, match=f"port {taken} is in use; fixed-thing listens"):
            platform._choose_ports()


def _flag(argv: list[str], flag: str) -> str:
    """The value after ``flag`` in ``argv``."""
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("with_gateway", [True, False], ids=["gateway", "runtime"])
def test_with_the_gateway_every_component_reaches_functions_through_it(
    tmp_path: Path, with_gateway: bool
) -> None:
    """The wiring that :func:`test_one_fl_job_through_the_openfaas_gateway` runs end to end: the
    cache engine, request tracker and control plane are given the gateway's URL for
    ``/system/*`` and ``/function/*`` (the runtime's without a gateway), the gateway the runtime
    as its provider, and the runtime knows it is behind one."""
    names = ("runtime", "minio", "minio_console", "redis", "gateway", "gateway_node1")
    names += ("cache_engine", "request_tracker", "control_plane", "prometheus")
    ports = {name: 31000 + i for i, name in enumerate(names)}
    if with_gateway:
        ports |= {"openfaas_gateway": 8080, "openfaas_gateway_metrics": 8082}
    ctx = Context(
        state_dir=tmp_path,
        host="127.0.0.1",
        stack_file=tmp_path / "stack.yml",
        platform_id="wiring",
        ports=ports,
        openfaas_gateway=Path("/opt/openfaas/gateway") if with_gateway else None,
    )
    runtime = "http://127.0.0.1:31000"
    functions = "http://127.0.0.1:8080" if with_gateway else runtime
    assert ctx.openfaas_url() == functions
    assert _flag(optional.CACHE_ENGINE.argv(ctx), "--runtime") == functions
    assert _flag(optional.REQUEST_TRACKER.argv(ctx), "--runtime") == functions
    assert _flag(optional.CONTROL_PLANE.argv(ctx), "--provider") == functions
    runtime_argv = parts.RUNTIME.argv(ctx)
    assert ("--behind-gateway" in runtime_argv) is with_gateway, runtime_argv
    if with_gateway:
        spec = gateway_parts.OPENFAAS_GATEWAY
        assert spec.argv(ctx) == ["/opt/openfaas/gateway"]
        assert spec.env is not None
        assert spec.env(ctx)["functions_provider_url"] == f"{runtime}/"


@pytest.mark.slow  # a platform of its own; before the module's, which holds :8080 once up
def test_on_the_default_tls_platform_a_job_and_a_query_go_through_the_gateway(
    tmp_path: Path,
) -> None:
    """``fedfaas up --with all --openfaas-gateway PATH`` with TLS, ``up``'s default: the
    gateway (plain HTTP on :8080, upstream) calls the runtime over https as its provider,
    trusting the platform's CA that ``SSL_CERT_FILE`` names in its environment. Through it:
    ``/system/functions``, an invocation of ``echo``, and the parts' calls while a job of the
    README's kind runs over https (the control plane's on the ``aggregator``, the cache
    engine's deploy and load of a cache function for a query)."""
    import psutil

    from client.data import federated_digits
    from client.model import load_bytes_into, make_model, model_to_bytes
    from client.sdk import submit_job
    from client.train import TrainConfig, train_local
    from fedfaas.platform import credentials

    binary = require_binary("gateway")
    require_prometheus()
    state_dir = tmp_path / "state"
    args = ("--with", "all", "--openfaas-gateway", str(binary))
    with running_platform(state_dir, *args, env=any_ports_env(), timeout=300, tls=True) as st:
        runtime, gateway = st.record("runtime"), st.record("openfaas-gateway")
        assert st.tls and runtime is not None and gateway is not None
        assert runtime.address.startswith("https://")
        secrets = state_dir / "secrets"
        ca = secrets / "tls" / "ca.crt"
        assert psutil.Process(gateway.pid).environ()["SSL_CERT_FILE"] == str(ca)
        listed = httpx.get(
            "http://127.0.0.1:8080/system/functions",
            auth=credentials.basic_auth(secrets),
            timeout=30,
        )
        assert listed.status_code == 200, listed.text
        assert {"echo", "aggregator"} <= {f["name"] for f in listed.json()}
        token = credentials.read(secrets, credentials.FUNCTION_TOKEN)
        echoed = httpx.post(
            "http://127.0.0.1:8080/function/echo",
            content=b"through the gateway",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert echoed.status_code == 200 and echoed.content == b"through the gateway", echoed.text

        data = federated_digits(4, seed=1)
        job = submit_job(
            f"https://{st.host}:{st.ports['control_plane']}",
            "tls-through-gateway",
            model_to_bytes(make_model(0, "softmax")),
            rounds=1,
            goal=4,
            admin_token=credentials.read(secrets, "gateway-admin-secret"),
            tracker_url=f"https://{st.host}:{st.ports['request_tracker']}",
            analyst_token=credentials.read(secrets, credentials.ANALYST_TOKEN),
            ca_file=ca,
        )
        job.enroll([c.client_id for c in data.clients])
        for c in data.clients:
            with job.client(c.client_id, round=1) as fl:
                net = load_bytes_into(make_model(0, "softmax"), fl.wait_for_version(0).data)
                trained = train_local(net, c.x, c.y, TrainConfig())
                fl.upload(1, net.state_dict(), trained.num_samples)
        job.wait()
        assert [(r["round"], r["state"]) for r in job.history()] == [(1, "closed")]
        answer = job.query("multi-krum", rounds=[1], params={"f": 1})
        assert answer["result"]["workload"] == "multi-krum"
        p = Platform(state_dir, {})

        def through_the_gateway() -> bool:
            seen = forwarded(p)
            return any(
                "aggregator" in path and path.startswith("/system/") and code.startswith("2")
                for _, path, code in seen
            ) and any(
                re.fullmatch(r"/function/flstore-cache-\d+/load", path) and code == "200"
                for _, path, code in seen
            )

        wait_until(through_the_gateway, 60, "the parts' calls through the gateway to https")
        log = (state_dir / "logs" / "openfaas-gateway.log").read_text()
        assert "x509" not in log and "certificate" not in log, log[-2000:]


@pytest.mark.slow  # the whole platform with the gateway; the wiring test above is the fast one
def test_one_fl_job_through_the_openfaas_gateway(platform: Platform) -> None:
    p = platform
    assert p.urls["openfaas_gateway"] == "http://127.0.0.1:8080"
    # the gateway fronts the runtime: the stack's functions, with the runtime's basic auth
    r = httpx.get(f"{p.urls['openfaas_gateway']}/system/functions", auth=p.runtime_auth)
    assert r.status_code == 200, r.text
    assert "aggregator" in {f["name"] for f in r.json()}
    assert httpx.get(f"{p.urls['openfaas_gateway']}/system/functions").status_code == 401
    # the runtime answers as the gateway's provider: the gateway names it
    info = httpx.get(f"{p.urls['openfaas_gateway']}/system/info", auth=p.runtime_auth).json()
    assert (info["provider"]["provider"], info["provider"]["orchestration"]) == (
        "fedfaas-runtime",
        "process",
    )

    clients = [f"g{i}" for i in range(4)]
    p.create_job("through-gateway", clients, rounds=1)
    updates, weights = run_round(p, "through-gateway", clients, 1, seed=7)
    with p.root_client("through-gateway", "g0") as fl:
        model = fl.wait_for_version(1, timeout=120)
    assert_fedavg(model.data, updates, weights)

    # the control plane reads (and scales) the aggregator through the gateway
    calls = wait_until(
        lambda: [c for c in forwarded(p) if "aggregator" in c[1] and c[1].startswith("/system/")],
        60,
        "the control plane's /system/* calls on the aggregator through the gateway",
    )
    assert all(code.startswith("2") for _, _, code in calls), calls

    # the completed round went into the cache: the cache engine deployed flstore-cache-N
    # through the gateway (faas-cli's PUT, then POST on 404) and loaded the model into it
    # through the gateway's /function/ route
    def cached() -> bool:
        seen = forwarded(p)
        return ("POST", "/system/functions", "202") in seen and any(
            re.fullmatch(r"/function/flstore-cache-\d+/load", path) and code == "200"
            for _, path, code in seen
        )

    wait_until(cached, 60, "the cache engine's deploy and load through the gateway")
    # Prometheus scrapes the gateway
    prom = p.urls["prometheus"]
    up = httpx.get(f"{prom}/api/v1/query", params={"query": "up"}, timeout=10).json()
    assert any(s["value"][1] == "1" for s in up["data"]["result"]), up
