"""The gateway's memory under announced-but-unsent bodies, measured on a real gateway process
(``python -m gateway``, its resident set read from /proc) with aggregator replicas and real Redis.

Twenty connections that announce 1 GiB bodies on any route, with or without credentials, must
leave the gateway's RSS within 64 MB of where it was while real clients' rounds complete; the
job-creation body must arrive in shared memory, not on the heap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from client.model import bytes_to_state_dict, make_model, model_to_bytes
from client.sdk import FLClient, create_job
from core import wire
from tests.dataplane.gwproc import gateway_process
from tests.dataplane.rawhttp import read_answer, send_head

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MB = 1 << 20
CLIENTS = ["c0", "c1", "c2", "c3"]


@dataclass
class Node:
    url: str
    port: int
    admin: str
    pid: int


@pytest.fixture()
def node(tmp_path: Path, redis_url: str) -> Iterator[Node]:
    """A node gateway subprocess with one ``aggregator`` replica (two endpoints)."""
    # the attackers below stay connected for the whole test
    with gateway_process(tmp_path, redis_url, pool=1, read_timeout=300) as (gw, admin):
        yield Node(gw.url, gw.settings.port, admin, gw.pid)


def memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssShmem of ``pid`` in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    return out


class Sampler:
    """Samples a process's VmRSS every 20 ms in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, memory(self.pid)["VmRSS"])
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def attacks(job: str, admin: str, token: str) -> list[tuple[str, str, dict[str, str], int | None]]:
    """(method, target, headers, expected status; None: accepted, waits for its body)."""
    auth = {"Authorization": f"Bearer {admin}"}
    up = {"X-Client-Id": "c0", "X-Sample-Count": "1"}
    return [
        ("POST", "/v1/jobs?job=atk&rounds=1&goal=1&clients=a", {}, 401),
        ("POST", "/v1/jobs?job=atk&rounds=1&goal=1&clients=a", auth, None),
        ("POST", f"/v1/jobs/{job}/rounds/1/updates", up, 401),
        (
            "POST",
            f"/v1/jobs/{job}/rounds/1/updates",
            {**up, "Authorization": f"Bearer {token}"},
            413,
        ),
        ("POST", "/v1/no/such/route", {}, 404),
        ("POST", "/v1/no/such/route", auth, 404),
        ("PUT", f"/v1/jobs/{job}/rounds/1/plan", {}, 401),
        ("PUT", f"/v1/jobs/{job}/rounds/1/plan", auth, 413),
        ("POST", f"/v1/jobs/{job}/rounds/1/close", {}, 401),
        ("POST", f"/v1/jobs/{job}/rounds/1/close", auth, 413),
    ]


def upload(client: FLClient, rnd: int, update: bytes, samples: int) -> None:
    assert client.upload(rnd, update, samples).round == rnd


def test_twenty_connections_announcing_1gib_bodies_leave_rss_flat_while_rounds_complete(
    node: Node,
) -> None:
    updates = [model_to_bytes(make_model(seed)) for seed in range(len(CLIENTS) + 1)]
    samples = [10, 20, 30, 40]
    job = create_job(
        node.url, node.admin, "mem", updates[-1], rounds=2, goal=len(CLIENTS), clients=CLIENTS
    )
    kinds = attacks("mem", node.admin, job.tokens["c0"])
    # warm every path once (small bodies), so the baseline holds what a used gateway holds
    for method, target, headers, _ in kinds:
        warm = target.replace("job=atk", "job=warm") if "job=atk" in target else target
        s = send_head(node.port, method, warm, headers, content_length=8, body=b"not json")
        read_answer(s)
        s.close()
    baseline = max(memory(node.pid)["VmRSS"] for _ in range(3))

    socks = []
    with Sampler(node.pid) as rss:
        for i in range(20):
            method, target, headers, want = kinds[i % len(kinds)]
            target = target.replace("job=atk", f"job=atk-{i}")
            s = send_head(
                node.port, method, target, headers, content_length=GIB, body=b"\0" * (64 << 10)
            )
            socks.append((s, want))
        for s, want in socks:
            if want is not None:
                assert read_answer(s, timeout=10).status == want
        # the accepted job bodies wait for their bytes: still connected, nothing answered
        for s, want in socks:
            if want is None:
                s.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    s.recv(1)
        attacked = memory(node.pid)["VmRSS"]

        # real clients: two rounds, each aggregated by the replicas, while those connections hang
        clients = [FLClient(node.url, "mem", c, job.tokens[c]) for c in CLIENTS]
        with ThreadPoolExecutor(len(clients)) as pool:
            for rnd in (1, 2):
                rounds = [rnd] * len(clients)
                list(pool.map(upload, clients, rounds, updates[:4], samples))
                model = clients[0].wait_for_version(rnd, timeout=60)
                assert model.version == rnd
                if rnd == 1:
                    got = bytes_to_state_dict(model.data)
                    for name, tensor in got.items():
                        want = np.average(
                            [bytes_to_state_dict(u)[name].numpy() for u in updates[:4]],
                            axis=0,
                            weights=samples,
                        )
                        np.testing.assert_allclose(tensor.numpy(), want, rtol=1e-5, atol=1e-6)
        for c in clients:
            c.close()
    for s, _ in socks:
        s.close()
    grew = rss.peak - baseline
    print(
        f"\ngateway RSS: baseline {baseline / MB:.1f} MB, after 20 connections "
        f"{attacked / MB:.1f} MB, peak during the attack and two rounds {rss.peak / MB:.1f} MB "
        f"(+{grew / MB:.1f} MB)"
    )
    assert grew < 64 * MB, f"RSS grew by {grew / MB:.0f} MB"


def test_the_job_body_arrives_in_shared_memory_not_on_the_heap(node: Node) -> None:
    rng = np.random.default_rng(7)
    body = wire.encode_tensors({"w": rng.standard_normal(128 * MB // 4).astype(np.float32)})
    half = len(body) // 2
    before = memory(node.pid)
    target = "/v1/jobs?job=big&rounds=1&goal=1&clients=c0"
    auth = {"Authorization": f"Bearer {node.admin}"}
    s = send_head(node.port, "POST", target, auth, content_length=len(body), body=body[:half])
    try:
        deadline = time.monotonic() + 30
        while memory(node.pid)["RssShmem"] - before["RssShmem"] < half * 0.95:
            assert time.monotonic() < deadline, memory(node.pid)
            time.sleep(0.02)
        mid = memory(node.pid)
        anon = mid["RssAnon"] - before["RssAnon"]
        print(
            f"\nhalf of a {len(body) / MB:.0f} MB job body received: RssShmem "
            f"+{(mid['RssShmem'] - before['RssShmem']) / MB:.1f} MB, RssAnon +{anon / MB:.1f} MB"
        )
        assert anon < 16 * MB, f"the heap grew by {anon / MB:.0f} MB while the body arrived"
        s.sendall(body[half:])
        a = read_answer(s, timeout=60)
        assert a.status == 201, a.body
    finally:
        s.close()
    with FLClient(node.url, "big", "c0", a.json()["tokens"]["c0"]) as c:
        assert c.fetch_model().data == body
