"""Real node gateways (``python -m gateway``) as subprocesses for the control-plane tests.

They share a Redis journal, an object-store root and an admin secret file, know each other
as peers and run the userspace router (no eBPF needed). Their command lines come from
:meth:`gateway.settings.GatewaySettings.to_argv`, as every launcher's do. Aggregation runs
in replicas of the ``aggregator`` function, started beside each gateway as the runtime
starts them (:class:`tests.aggregators.NodeAggregators`: job-agnostic, registered with the
node's router socket, granted jobs by the gateway). They are stopped, process group and all,
on exit, also when the test killed their gateway.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from safetensors.numpy import save

from core.services import wait_for_port
from gateway.settings import GatewaySettings
from tests.aggregators import NodeAggregators
from tests.polling import wait_until
from tests.ports import distinct_ports

ROOT = Path(__file__).resolve().parents[2]

#: aggregator replicas per node and endpoints per replica (slots a node serves at once)
REPLICAS, ENDPOINTS = 1, 2


def gateway_env() -> dict[str, str]:
    """This process's environment less any ``FEDFAAS_GATEWAY_*`` setting (the argv says all)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_GATEWAY_")}


@contextmanager
def real_gateways(
    redis_url: str,
    tmp_path: Path,
    names: tuple[str, ...] = ("n1", "n2"),
    extra: dict[str, Any] | None = None,
) -> Iterator[tuple[dict[str, str], str, dict[str, subprocess.Popen[bytes]]]]:
    """Yield ``(urls by node, admin secret, processes by node)``.

    Every node has ``REPLICAS`` aggregator replicas of ``ENDPOINTS`` endpoints registered
    before this yields. On exit the gateways still alive stop (SIGTERM), then the replicas.
    ``extra``: more settings of every gateway (tests/tls: its ``tls_*``, then the urls are
    ``https``, verified by this process's httpx through ``SSL_CERT_FILE``).
    """
    extra = extra or {}
    scheme = "https" if extra.get("tls_cert_file") else "http"
    secret = secrets.token_hex(32)
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    ports = dict(zip(names, distinct_ports(len(names)), strict=True))
    urls = {n: f"{scheme}://127.0.0.1:{p}" for n, p in ports.items()}
    shm = Path("/dev/shm") / f"fedfaas-cp-{os.urandom(4).hex()}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    aggs: dict[str, NodeAggregators] = {}
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, shm, ignore_errors=True)
        cleanup.callback(_stop_all, procs, aggs)
        for node, port in ports.items():
            settings = GatewaySettings(
                node=node,
                port=port,
                state_dir=tmp_path / node,
                redis_url=redis_url,
                redis_credentials_file=redis_url.credentials_file("gateway"),  # type: ignore[attr-defined]
                shm_root=shm,
                prefer_ebpf=False,
                admin_secret_file=secret_file,
                peers={n: u for n, u in urls.items() if n != node},
                **extra,
            )
            procs[node] = _spawn(settings.to_argv(), tmp_path / f"{node}.log", "wb")
            aggs[node] = NodeAggregators(
                node,
                settings.socket_path(),
                tmp_path / f"{node}-aggregators",
                urls[node],
                admin_secret_file=secret_file,
            )
        for node, port in ports.items():
            wait_for_port("127.0.0.1", port, 60, procs[node])
        # the replicas draw their own ports: only once every gateway holds its own
        for a in aggs.values():
            a.spawn(REPLICAS, ENDPOINTS)
        for a in aggs.values():
            a.wait_registered(REPLICAS * ENDPOINTS)
        check_identities(urls, procs)
        yield urls, secret, procs


def check_identities(urls: dict[str, str], procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Every gateway started is alive and its address answers as its own node.

    A gateway that lost its port (EADDRINUSE at its bind, its last start step) exits, while
    the process that took the port answers in its place: the tests would talk to the wrong
    node (a job created on no gateway, "not known there 30 s after creation").
    """
    for node, url in urls.items():
        code = procs[node].poll()
        if code is not None:
            raise RuntimeError(f"gateway {node} exited with code {code} after it started")
        said = httpx.get(f"{url}/healthz", timeout=10).json().get("node")
        if said != node:
            raise RuntimeError(f"the address of gateway {node} ({url}) answers as node {said}")


def _stop_all(procs: dict[str, subprocess.Popen[bytes]], aggs: dict[str, NodeAggregators]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    for a in aggs.values():
        try:
            a.stop()
        finally:
            a.kill_all()  # what did not stop (a no-op once stop() is through)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a gateway (no clean stop: its shared memory and in-flight updates are lost).

    Its aggregator replicas live on (as they would on the node), retrying to register.
    """
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _spawn(argv: list[str], log: Path, mode: str) -> subprocess.Popen[bytes]:
    with open(log, mode) as out:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=gateway_env(),
        )


def respawn(procs: dict[str, subprocess.Popen[bytes]], node: str, log: Path) -> None:
    """Start a killed node's gateway again with the same argv (as the platform's supervisor
    does), appending to ``log``; returns once it listens."""
    argv = [str(a) for a in procs[node].args]  # type: ignore[union-attr]
    procs[node] = _spawn(argv, log, "ab")
    port = int(argv[argv.index("--port") + 1])
    wait_for_port("127.0.0.1", port, 60, procs[node])


def upload(url, job, rnd, client, token, tensors, weight):  # type: ignore[no-untyped-def]
    """Upload ``tensors`` as ``client`` with its ``token`` (from the job's creation answer)."""
    return httpx.post(
        f"{url}/v1/jobs/{job}/rounds/{rnd}/updates",
        content=save(tensors),
        headers={
            "X-Client-Id": client,
            "X-Sample-Count": str(weight),
            "Authorization": f"Bearer {token}",
        },
        timeout=30,
    )


def wait_round_open(url: str, job: str, rnd: int, secret: str, timeout: float = 60.0) -> None:
    """Wait until the gateway at ``url`` has round ``rnd`` (or a later one) open.

    A node that is not the job's root opens the next round when it learns of the root's
    publication (its journal poll), a moment after the control plane shows the round open:
    asked before, it answers 409 ``round_not_open``, which the SDK asks again and a raw
    :func:`upload` does not (seen under CI in test_partial_forwarding, c84ddc8)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/v1/jobs/{job}", headers={"Authorization": f"Bearer {secret}"})
        if r.status_code == 200 and int(r.json()["round"] or 0) >= rnd:
            return
        assert time.monotonic() < deadline, f"round {rnd} of {job} not open at {url}: {r.text}"
        time.sleep(0.05)


def completed(
    api: Any, job: str, rounds: int, within: float = 60, *, next_open: bool = False
) -> dict[str, Any]:
    """The control plane's view of ``job`` (``api``: its client) once ``rounds`` rounds are
    completed and, with ``next_open``, the next one shows (its plan has reached the gateways, a
    moment after the close)."""

    def view() -> dict[str, Any] | None:
        r = api.get(f"/v1/jobs/{job}")
        assert r.status_code == 200, r.text
        v: dict[str, Any] = r.json()
        done = v["completed"] == rounds and (not next_open or v["round"]["number"] == rounds + 1)
        return v if done else None

    return wait_until(view, within, f"{rounds} rounds of {job} completed")


def create_job(api: Any, w0: dict[str, Any], **fields: Any) -> httpx.Response:
    """``POST /v1/jobs`` on the control plane client ``api`` with the initial weights ``w0``
    and the job's ``fields``; the answer (asserted 201)."""
    body = {**fields, "weights_b64": base64.b64encode(save(w0)).decode()}
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r  # type: ignore[no-any-return]
