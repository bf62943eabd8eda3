"""The store's handoff: a round's objects lent read-only to another process under leases.

Another process claims a ticket, reads the objects in place through the directory fd it gets,
and its leases keep the objects alive until it releases them or dies; an unclaimed offer ends
with its ticket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from core import wire
from core.objstore import Namespace
from core.objstore.handoff import HandoffClient, HandoffError, HandoffServer
from tests.polling import wait_until

SPEC = wire.ModelSpec.build([("b", "F32", (10,)), ("w", "F32", (7, 3))])  # 31 floats, no gap
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def store() -> Iterator[tuple[Namespace, HandoffServer]]:
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ns = Namespace(root, "node0", "job1", SPEC.object_nbytes, pool=2)
    server = HandoffServer(root / "node0" / "handoff.sock")
    yield ns, server
    server.close()
    ns.close()
    assert not root.exists()


def _update(ns: Namespace, value: float) -> bytes:
    obj = ns.allocate()
    wire.write_header(obj.buf, SPEC, kind=wire.KIND_UPDATE, weight=1, count=1, round=1)
    wire.flat_view(obj.buf, SPEC)[:] = 0
    wire.flat_view(obj.buf, SPEC)[: SPEC.numel] = value + np.arange(SPEC.numel)
    kb = obj.key_bytes
    obj.close()
    ns.seal(kb)
    return kb


def _offer(ns: Namespace, server: HandoffServer, ttl: float = 30.0) -> tuple[str, dict[str, bytes]]:
    keys = {f"c{i}": _update(ns, 100.0 * i) for i in range(3)}
    for k in keys.values():
        ns.retain(k)  # the offer's lease, beside the round's own
    return server.offer(ns, "job1", 1, SPEC.numel, SPEC.hash.hex(), keys, ttl), keys


def test_a_claim_reads_every_object_in_place_and_its_leases_outlive_the_owners(
    store: tuple[Namespace, HandoffServer],
) -> None:
    ns, server = store
    ticket, keys = _offer(ns, server)
    lost: list[HandoffClient] = []
    client = HandoffClient(server.path, lost.append)
    try:
        c = client.claim(ticket)
        assert (c.job, c.round, c.numel, c.spec_hash) == ("job1", 1, SPEC.numel, SPEC.hash.hex())
        assert c.objects == {n: k.hex() for n, k in keys.items()}
        for i, (name, key) in enumerate(keys.items()):
            obj = c.store.open(c.objects[name])
            x = obj.ndarray(np.float32, wire.HEADER_SIZE, c.numel)
            np.testing.assert_array_equal(x, 100.0 * i + np.arange(SPEC.numel))
            with pytest.raises((TypeError, ValueError)):
                x[0] = 1  # mapped read-only
            assert ns.leases(key) == 3  # the round's, the offer's, the claim's
        assert client.claim(ticket) is c  # claiming again takes no second lease
        assert ns.leases(keys["c0"]) == 3
        # the owner lets go (round over, offer ended): the claim alone keeps the objects
        for k in keys.values():
            ns.release(k)
        assert client.release(ticket, ["c0", "nobody"]) == 1
        assert ns.leases(keys["c0"]) == 1 and ns.leases(keys["c1"]) == 2
    finally:
        client.close()
    wait_until(lambda: server.leases() == 3, 5)  # the closed connection's leases went back
    assert ns.leases(keys["c1"]) == 1 and not lost  # a client's own close is not a loss


def test_an_unclaimed_offer_ends_with_its_ticket(store: tuple[Namespace, HandoffServer]) -> None:
    ns, server = store
    ticket, keys = _offer(ns, server, ttl=0.2)
    wait_until(lambda: server.leases() == 0, 5)
    assert all(ns.leases(k) == 1 for k in keys.values())  # only the round's own lease
    client = HandoffClient(server.path, lambda _: None)
    try:
        with pytest.raises(HandoffError, match="unknown_ticket"):
            client.claim(ticket)
        with pytest.raises(HandoffError, match="bad_request"):
            client.claim("not-a-ticket")
    finally:
        client.close()


def test_a_claimer_that_dies_gives_its_leases_back(store: tuple[Namespace, HandoffServer]) -> None:
    ns, server = store
    ticket, keys = _offer(ns, server)
    script = textwrap.dedent(
        f"""
        import json, sys, numpy as np
        from core.objstore.handoff import HandoffClient
        c = HandoffClient({str(server.path)!r}, lambda _: None).claim({ticket!r})
        sums = {{n: float(c.store.open(k).ndarray(np.float32, 64, c.numel).sum())
                 for n, k in c.objects.items()}}
        print(json.dumps(sums), flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        sums = json.loads(proc.stdout.readline())
        assert sums == {f"c{i}": float((100.0 * i + np.arange(SPEC.numel)).sum()) for i in range(3)}
        assert all(ns.leases(k) == 3 for k in keys.values())
    finally:
        proc.kill()
        proc.wait()
    for k in keys.values():
        ns.release(k)  # the offer ends with the round: only the dead claimer's leases left
    wait_until(lambda: all(ns.leases(k) == 1 for k in keys.values()), 5)


def test_a_withdrawn_store_closes_its_claimers_connections(
    store: tuple[Namespace, HandoffServer],
) -> None:
    ns, server = store
    ticket, keys = _offer(ns, server)
    lost = threading.Event()
    client = HandoffClient(server.path, lambda _: lost.set())
    try:
        client.claim(ticket)
        fds = len(os.listdir("/proc/self/fd"))
        server.withdraw(ns)
        assert lost.wait(5)
        assert server.leases() == 0
        wait_until(lambda: not client.claims, 5)  # the claim's folder and arena are closed
        assert len(os.listdir("/proc/self/fd")) < fds
        assert all(ns.leases(k) == 1 for k in keys.values())
        with pytest.raises(HandoffError):
            client.claim(ticket)
    finally:
        client.close()


def test_a_jobs_next_offer_ends_its_earlier_one_but_not_what_was_claimed(
    store: tuple[Namespace, HandoffServer],
) -> None:
    """Fast rounds must not pile up a round's updates per ttl: the job's next offer ends the
    earlier one; a claimer keeps what it claimed."""
    ns, server = store
    first, keys1 = _offer(ns, server)
    client = HandoffClient(server.path, lambda _: None)
    try:
        client.claim(first)
        second, keys2 = _offer(ns, server)
        assert all(ns.leases(k) == 2 for k in keys1.values())  # the round's + the claim's
        assert all(ns.leases(k) == 2 for k in keys2.values())  # the round's + the offer's
        assert server.leases() == 3 + 3
        other = HandoffClient(server.path, lambda _: None)
        try:
            with pytest.raises(HandoffError, match="unknown_ticket"):
                other.claim(first)
            assert set(other.claim(second).objects) == set(keys2)
        finally:
            other.close()
        assert client.release(first, ["c0", "c1", "c2"]) == 3  # an ended offer's claims
        assert all(ns.leases(k) == 1 for k in keys1.values())
    finally:
        client.close()
