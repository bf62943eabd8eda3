"""Two node gateways as processes (``python -m gateway``), ``n1`` and ``n2``, with node ``n2``
reaching ``n1`` through a :class:`~tests.dataplane.peerproxy.PeerProxy` the test turns against
the partials it forwards; each with its ``aggregator`` replicas registered."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.stack import GatewayProc, Replicas, start_gateway
from core import wire
from gateway.settings import GatewaySettings
from tests.control.realgw import check_identities
from tests.dataplane.gwutil import tiny_model
from tests.dataplane.peerproxy import PeerProxy
from tests.ports import distinct_ports


@dataclass
class TwoNodes:
    """The running pair: ``gw[node]``, the relay n2 reaches n1 through, the admin secret."""

    gw: dict[str, GatewayProc]
    proxy: PeerProxy
    secret: str

    def url(self, node: str) -> str:
        return self.gw[node].url

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def create(self, job: str, clients: list[str], goal: int, rounds: int) -> dict[str, Any]:
        """Create ``job`` on ``n1`` with nodes ``n1,n2`` (the static plan splits the clients)."""
        r = httpx.post(
            self.url("n1") + "/v1/jobs",
            params={
                "job": job,
                "rounds": rounds,
                "goal": goal,
                "clients": ",".join(clients),
                "nodes": "n1,n2",
            },
            content=wire.encode_tensors(tiny_model(0)),
            headers=self.admin(),
            timeout=30,
        )
        assert r.status_code == 201, r.text
        return dict(r.json())

    def status(self, node: str, job: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url(node)}/v1/jobs/{job}", headers=self.admin(), timeout=10)
        return dict(r.json()) if r.status_code == 200 else {}

    def metric(self, node: str, name: str) -> float:
        """The value of one sample of ``node``'s ``/metrics`` (0 when it has none yet)."""
        text = httpx.get(f"{self.url(node)}/metrics", headers=self.admin(), timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def log(self, node: str) -> str:
        return self.gw[node].log_path.read_text(errors="replace")


@contextmanager
def two_nodes(tmp_path: Path, redis_url: str, **settings: Any) -> Iterator[TwoNodes]:
    """Start ``n1`` and ``n2`` (``settings``: more of both's settings), one replica of two
    endpoints each; everything stopped, and the shared store root removed, afterwards."""
    secret = secrets.token_hex(32)
    secret_file = tmp_path / "admin-secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    shm = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ports = dict(zip(("n1", "n2"), distinct_ports(2), strict=True))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, shm, ignore_errors=True)
        proxy = stack.enter_context(PeerProxy(ports["n1"]))
        peers = {"n1": {"n2": f"http://127.0.0.1:{ports['n2']}"}, "n2": {"n1": proxy.url}}
        gws: dict[str, GatewayProc] = {}
        aggs: dict[str, Replicas] = {}
        for node, port in ports.items():
            s = GatewaySettings(
                node=node,
                port=port,
                state_dir=tmp_path / node,
                redis_url=redis_url,
                redis_credentials_file=redis_url.credentials_file("gateway"),  # type: ignore[attr-defined]
                shm_root=shm,
                prefer_ebpf=False,
                admin_secret_file=secret_file,
                peers=peers[node],
                fanout=2,
                pool=3,
                **settings,
            )
            gws[node] = start_gateway(s, tmp_path / f"{node}.log")
            stack.callback(gws[node].stop)
        # the replicas draw their own ports: only once both gateways hold theirs (n1's replica
        # drew n2's port before n2 bound it, and n2 lost it), and each answers as its node
        check_identities({n: g.url for n, g in gws.items()}, {n: g.proc for n, g in gws.items()})
        for node, gw in gws.items():
            aggs[node] = Replicas(gw, tmp_path / f"{node}-aggregators")
            stack.callback(aggs[node].stop)
            aggs[node].spawn(1, endpoints=2)
        for a in aggs.values():
            a.wait_registered(2)
        yield TwoNodes(gws, proxy, secret)
