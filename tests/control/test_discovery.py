"""Node gateways found through DNS (:mod:`core.discovery`), as behind a headless Service.

The pure parts (parsing, URL forming, choosing among duplicate claims) are tested directly,
and ``find`` with an injected resolver. The real-process tests give every process a private
mount namespace whose ``/etc/hosts`` maps one name to several loopback addresses (all of
127/8 is loopback on Linux), as a headless Service's DNS name maps to the pods' IPs: real
gateways listen on the SAME port on 127.0.0.2, 127.0.0.3 (and later 127.0.0.4), know their
peers only through ``--peers-service`` and the control plane its gateways only through
``--gateways-service``. That needs root and ``unshare``; the tests are skipped otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

from control_plane.api import create_app
from control_plane.coordinator import Coordinator
from control_plane.settings import ControlPlaneSettings
from core.auth import bearer
from core.discovery import Discovery, base_url, parse_service, pick, resolve
from core.services import free_port, wait_for_port
from gateway.settings import GatewaySettings
from tests.aggregators import NodeAggregators
from tests.commands import run_module
from tests.control import realgw
from tests.dataplane.gwproc import gateway_process
from tests.tokens import auth_header, token_file

ROOT = Path(__file__).resolve().parents[2]
NAME = "gateways.fedfaas.test"
#: seconds between two refreshes in these tests
INTERVAL = 0.3


# ---------------------------------------------------------------------- pure logic
def test_a_service_address_is_host_and_port_and_a_bad_one_says_what_is_wrong():
    assert parse_service("peers.openfaas.svc.cluster.local:8081") == (
        "peers.openfaas.svc.cluster.local",
        8081,
    )
    assert parse_service("[::1]:80") == ("::1", 80)
    for bad in ("peers", "peers:", ":8081", "peers:http", "peers:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_service(bad)


def test_ipv6_addresses_are_bracketed_in_urls():
    assert base_url("10.1.2.3", 8081) == "http://10.1.2.3:8081"
    assert base_url("fd00::7", 8081) == "http://[fd00::7]:8081"


def test_two_addresses_claiming_one_node_keep_the_lowest_url_and_warn(caplog):
    answers = {
        "http://10.0.0.9:81": "n1",
        "http://10.0.0.10:81": "n1",
        "http://10.0.0.11:81": "n2",
        "http://10.0.0.12:81": None,  # did not answer
    }
    with caplog.at_level(logging.WARNING, logger="core.discovery"):
        assert pick(answers) == {"n1": "http://10.0.0.10:81", "n2": "http://10.0.0.11:81"}
    assert "both claim node 'n1'" in caplog.text


def test_a_name_that_does_not_resolve_gives_no_address(caplog):
    with caplog.at_level(logging.WARNING, logger="core.discovery"):
        assert asyncio.run(resolve("no-such-gateway.invalid", 8081)) == []
    assert "does not resolve" in caplog.text


def test_addresses_that_do_not_answer_are_skipped():
    port = free_port()  # nothing listens there

    async def resolver(host: str, p: int) -> list[str]:
        assert (host, p) == ("peers.example", port)
        return ["127.0.0.1", "127.0.0.2"]

    async def run() -> dict[str, str]:
        d = Discovery(f"peers.example:{port}", timeout=1.0, resolver=resolver)
        try:
            return await d.find()
        finally:
            await d.aclose()

    assert asyncio.run(run()) == {}


def test_update_nodes_adds_new_nodes_and_follows_a_moved_one():
    async def run() -> None:
        coord = Coordinator({}, mc={"n2": 7.0})
        try:
            assert coord.healthy_nodes() == []
            await coord.update_nodes({"n2": "http://10.0.0.2:81/", "n1": "http://10.0.0.1:81"})
            assert list(coord.nodes) == ["n1", "n2"] and coord.healthy_nodes() == ["n1", "n2"]
            assert coord.nodes["n2"].mc == 7.0 and coord.nodes["n1"].mc == 20.0
            old = coord.clients["n2"]
            await coord.update_nodes({"n2": "http://10.0.0.5:81"})  # n1 missing: it stays
            assert coord.nodes["n2"].url == coord.clients["n2"].url == "http://10.0.0.5:81"
            assert old is not coord.clients["n2"] and list(coord.nodes) == ["n1", "n2"]
            await coord.update_nodes({})
            assert old._client.is_closed  # the moved node's old pool, a call later
        finally:
            await coord.stop()

    asyncio.run(run())


def test_the_control_plane_needs_gateways_or_a_gateways_service():
    r = run_module("control_plane", "--port", str(free_port()))
    assert r.returncode == 2 and "--gateways-service HOST:PORT" in r.stderr
    r = run_module("control_plane", "--gateways-service", "peers")
    assert r.returncode == 2 and "--gateways-service" in r.stderr and "HOST:PORT" in r.stderr
    r = run_module("gateway", "--peers-service", "peers:http")
    assert r.returncode == 2 and "--peers-service" in r.stderr and "HOST:PORT" in r.stderr


@pytest.mark.slow  # over 10 s: `make test-slow`
@pytest.mark.integration
def test_gateways_entries_win_over_discovered_ones(redis_url, tmp_path):
    with gateway_process(tmp_path, redis_url) as (gw, _secret):
        static = "http://127.0.0.1:9"  # nothing listens: n1 leaves placement
        settings = ControlPlaneSettings(
            gateways=f"n1={static}",
            gateways_service=f"localhost:{gw.settings.port}",  # where n1 really is
            discovery_interval=0.1,
            tick_s=0.05,
            admin_token_file=token_file(tmp_path),
        )
        with TestClient(create_app(settings), headers=auth_header(tmp_path / "admin-token")) as api:
            deadline = time.monotonic() + 30
            while True:  # the probes of the static URL fail; discovery does not replace it
                (n,) = api.get("/v1/nodes").json()["nodes"]
                assert n["name"] == "n1" and n["url"] == static
                if not n["healthy"] and n["failures"] >= 10:
                    break
                assert time.monotonic() < deadline, n
                time.sleep(0.05)


# ---------------------------------------------------------------------- real processes
def _namespaces_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a private mount namespace with its own /etc/hosts)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    return None


needs_ns = pytest.mark.skipif(_namespaces_usable() is not None, reason=str(_namespaces_usable()))


def in_namespace(hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a private mount namespace where ``hosts`` is ``/etc/hosts``.

    ``unshare`` and ``sh`` exec the command, so the process is the command (signals reach it).
    """
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts), *argv]


def hosts_file(folder: Path, addresses: list[str]) -> Path:
    """An /etc/hosts mapping :data:`NAME` to every address (one line each, as DNS would)."""
    path = folder / "hosts"
    lines = ["127.0.0.1 localhost", *(f"{a} {NAME}" for a in addresses)]
    path.write_text("\n".join(lines) + "\n")
    return path


class Cluster:
    """Gateways on one port, each on its own loopback address, found through :data:`NAME`."""

    def __init__(self, redis_url, tmp_path: Path, stack: ExitStack) -> None:  # type: ignore[no-untyped-def]
        self.redis_url, self.tmp, self.stack = redis_url, tmp_path, stack
        self.secret = secrets.token_hex(32)
        self.secret_file = tmp_path / "secret"
        self.secret_file.write_text(self.secret)
        self.secret_file.chmod(0o600)
        self.port = free_port()
        # .4 and .5 are listed from the start: pods not answering yet (publishNotReadyAddresses)
        self.hosts = hosts_file(tmp_path, [f"127.0.0.{i}" for i in (2, 3, 4, 5)])
        self.shm = Path("/dev/shm") / f"fedfaas-disc-{os.urandom(4).hex()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.aggs: list[NodeAggregators] = []
        stack.callback(shutil.rmtree, self.shm, ignore_errors=True)
        stack.callback(self._stop)

    def _stop(self) -> None:
        """The gateways and the control plane (SIGTERM), then the replicas."""
        realgw._stop_all({str(i): p for i, p in enumerate(self.procs)}, {})
        for a in self.aggs:
            try:
                a.stop()
            finally:
                a.kill_all()

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / log_name, "wb") as log:
            p = subprocess.Popen(
                in_namespace(self.hosts, argv),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=realgw.gateway_env(),
            )
        self.procs.append(p)
        return p

    def gateway(self, node: str, address: str) -> str:
        """Start node ``node`` on ``address`` with its aggregator replicas; its URL."""
        settings = GatewaySettings(
            node=node,
            host=address,
            port=self.port,
            state_dir=self.tmp / node,
            redis_url=self.redis_url,
            redis_credentials_file=self.redis_url.credentials_file("gateway"),
            shm_root=self.shm,
            prefer_ebpf=False,
            admin_secret_file=self.secret_file,
            peers_service=f"{NAME}:{self.port}",  # no static peers
            discovery_interval=INTERVAL,
        )
        p = self._spawn(settings.to_argv(), f"{node}.log")
        url = f"http://{address}:{self.port}"
        aggs = NodeAggregators(
            node,
            settings.socket_path(),
            self.tmp / f"{node}-aggregators",
            url,
            admin_secret_file=self.secret_file,
        )
        self.aggs.append(aggs)
        aggs.spawn(realgw.REPLICAS, realgw.ENDPOINTS)
        wait_for_port(address, self.port, 60, p)
        aggs.wait_registered(realgw.REPLICAS * realgw.ENDPOINTS)
        return url

    def control_plane(self) -> str:
        """Start the control plane, told only ``--gateways-service``; its URL."""
        port = free_port()
        settings = ControlPlaneSettings(
            port=port,
            gateways_service=f"{NAME}:{self.port}",
            discovery_interval=INTERVAL,
            tick_s=0.05,
            mc=3.0,
            admin_token_file=self.secret_file,
        )
        p = self._spawn(settings.to_argv(), "control-plane.log")
        wait_for_port("127.0.0.1", port, 60, p)
        return f"http://127.0.0.1:{port}"


@contextmanager
def cluster(redis_url, tmp_path: Path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with ExitStack() as stack:
        yield Cluster(redis_url, tmp_path, stack)


def wait_nodes(cp: str, secret: str, want: dict[str, str]) -> list[dict]:  # type: ignore[type-arg]
    """``GET /v1/nodes`` until it lists exactly ``want`` (name -> url), all healthy."""
    deadline = time.monotonic() + 60
    while True:
        nodes = httpx.get(f"{cp}/v1/nodes", headers=bearer(secret)).json()["nodes"]
        if {n["name"]: n["url"] for n in nodes} == want and all(n["healthy"] for n in nodes):
            return nodes  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, nodes
        time.sleep(0.1)


@needs_ns
def test_the_control_plane_starts_before_any_gateway_and_refuses_jobs_clearly(redis_url, tmp_path):
    with cluster(redis_url, tmp_path) as c:
        cp = c.control_plane()
        time.sleep(3 * INTERVAL)  # a few lookups: the name resolves, nothing answers
        assert httpx.get(f"{cp}/v1/nodes", headers=bearer(c.secret)).json()["nodes"] == []
        job = {"job": "early", "rounds": 1, "goal": 2, "clients": 4}
        r = httpx.post(f"{cp}/v1/jobs", json=job, headers=bearer(c.secret))
        assert r.status_code == 503
        assert r.json()["error"] == "no_healthy_nodes"
        assert "no node gateway answers /healthz" in r.json()["detail"]


@pytest.mark.integration
@needs_ns
def test_discovered_gateways_run_a_two_node_round_and_a_later_node_joins(redis_url, tmp_path):
    with cluster(redis_url, tmp_path) as c:
        cp = c.control_plane()  # first: it starts while no gateway answers
        urls = {"n1": c.gateway("n1", "127.0.0.2"), "n2": c.gateway("n2", "127.0.0.3")}
        # the same port on two addresses behind one name: both found, by their /healthz node
        assert urls == {"n1": f"http://127.0.0.2:{c.port}", "n2": f"http://127.0.0.3:{c.port}"}
        wait_nodes(cp, c.secret, urls)
        w0 = {"a": np.zeros(64, np.float32), "b": np.zeros((3, 4), np.float32)}
        rng = np.random.default_rng(3)
        h = bearer(c.secret)
        r = httpx.post(
            f"{cp}/v1/jobs",
            json={
                "job": "disc",
                "rounds": 2,
                "goal": 4,
                "clients": 8,
                "weights_b64": base64.b64encode(save(w0)).decode(),
            },
            headers=h,
            timeout=200,
        )
        assert r.status_code == 201, r.text
        tokens, rnd = r.json()["tokens"], r.json()["round"]
        assert rnd["placement"] == "coordinator" and set(rnd["clients_per_node"]) == {"n1", "n2"}
        sent, nodes_used = [], set()
        for cl in (f"c{i}" for i in range(8)):
            a = httpx.get(f"{cp}/v1/jobs/disc/assignment", params={"client": cl}, headers=h)
            if a.status_code != 200 or len(sent) == 4:
                continue
            t = {
                "a": rng.integers(-8, 8, 64).astype(np.float32),
                "b": rng.integers(-8, 8, (3, 4)).astype(np.float32),
            }
            wgt = int(rng.integers(1, 9))
            res = realgw.upload(a.json()["gateway_url"], "disc", 1, cl, tokens[cl], t, wgt)
            if res.status_code == 409 and res.json()["error"] == "round_full":
                continue
            assert res.status_code == 202, res.text
            sent.append((t, wgt))
            nodes_used.add(a.json()["node"])
        assert len(sent) == 4 and nodes_used == {"n1", "n2"}  # a partial crossed nodes
        deadline = time.monotonic() + 90
        while httpx.get(f"{cp}/v1/jobs/disc", headers=h).json()["completed"] < 1:
            assert time.monotonic() < deadline, httpx.get(f"{cp}/v1/jobs/disc", headers=h).text
            time.sleep(0.05)
        hist = httpx.get(f"{cp}/v1/jobs/disc", headers=h).json()["history"][0]
        assert hist["state"] == "closed" and hist["published"] and hist["received"] == 4
        total = sum(w for _, w in sent)
        # the root published the exact FedAvg; the other node serves it, fetched from the root
        # at the discovered URL
        for url in urls.values():
            while True:
                m = httpx.get(f"{url}/v1/jobs/disc/model", headers=h, timeout=30)
                if m.status_code == 200 and m.headers["x-model-version"] == "1":
                    break
                assert time.monotonic() < deadline, (m.status_code, m.text[:200])
                time.sleep(0.1)
            model = load(m.content)
            for name in ("a", "b"):
                want = sum(w * t[name].astype(np.float64) for t, w in sent) / total
                np.testing.assert_allclose(model[name], want, rtol=1e-6, atol=1e-6)

        # a third node, started after the control plane, joins placement within a few lookups
        urls["n3"] = c.gateway("n3", "127.0.0.4")
        nodes = wait_nodes(cp, c.secret, urls)
        assert {n["name"] for n in nodes} == {"n1", "n2", "n3"}
        deadline = time.monotonic() + 60
        for node in ("n1", "n2"):  # and the gateways count it among their peers
            want = f"'n3': '{urls['n3']}'"
            while want not in (c.tmp / f"{node}.log").read_text():
                assert time.monotonic() < deadline, node
                time.sleep(0.1)
        # n3's pod is replaced by one on another address: the control plane follows it
        realgw.kill(c.procs[-1])
        urls["n3"] = c.gateway("n3", "127.0.0.5")
        wait_nodes(cp, c.secret, urls)
