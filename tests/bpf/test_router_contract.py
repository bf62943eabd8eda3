"""The router contract, run against the userspace router and the eBPF sidecar alike."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bpf
from bpf import Frame, Kind

from .conftest import Disconnects, join

pytestmark = pytest.mark.integration


def _wait_until(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_frames_reach_exactly_the_addressed_endpoint(router: bpf.RouterServer) -> None:
    gw = router.local_endpoint(1)
    aggs = [join(router, 1) for _ in range(3)]
    try:
        for i, agg in enumerate(aggs):
            gw.send(
                Frame(
                    dst=agg.id,
                    src=0,
                    kind=Kind.UPDATE,
                    job=1,
                    key=bytes([i]) * 16,
                    weight=10.0 + i,
                    seq=i,
                )
            )
        for i, agg in enumerate(aggs):
            got = agg.recv(timeout=5)
            assert got is not None
            assert (got.dst, got.src, got.kind, got.key, got.weight, got.seq) == (
                agg.id,
                gw.id,
                Kind.UPDATE,
                bytes([i]) * 16,
                10.0 + i,
                i,
            )
            assert got.t_ns > 0  # stamped at send
            assert agg.recv(timeout=0.05) is None  # nothing else for it
        aggs[0].send(Frame(dst=gw.id, src=0, kind=Kind.PARTIAL, job=1, count=1))
        back = gw.recv(timeout=5)
        assert back is not None and back.src == aggs[0].id and back.kind is Kind.PARTIAL
    finally:
        for a in aggs:
            a.close()
        gw.close()


def test_endpoint_ids_are_unique_nonzero_and_registered_with_the_peer_pid(
    router: bpf.RouterServer,
) -> None:
    eps = [join(router, 7, role=f"r{i}") for i in range(4)]
    gw = router.local_endpoint(7)
    try:
        ids = [e.id for e in eps] + [gw.id]
        assert len(set(ids)) == len(ids) and all(0 < i < 2**32 for i in ids)
        infos = router.endpoints()
        assert set(infos) == set(ids)
        assert [infos[e.id].role for e in eps] == ["r0", "r1", "r2", "r3"]
        assert all(infos[i].pid == os.getpid() and infos[i].job == 7 for i in ids)
        assert infos[gw.id].local and not infos[eps[0].id].local
        assert all(e.mode == router.mode for e in eps)
    finally:
        for e in eps:
            e.close()
        gw.close()


def test_frame_to_an_endpoint_of_another_job_is_dropped_and_counted(
    router: bpf.RouterServer,
) -> None:
    sender, same_job = join(router, 1), join(router, 1)
    other_job = join(router, 2)
    try:
        sender.send(Frame(dst=other_job.id, src=0, kind=Kind.UPDATE, job=1))
        assert other_job.recv(timeout=0.2) is None
        assert router.drops()["cross_job"] == 1
        assert router.metrics()[sender.id].drops == 1
        assert router.metrics()[other_job.id].msgs_received == 0
        # The sender's socket still works after a refusal (SK_DROP would stick on tcp_bpf).
        sender.send(Frame(dst=same_job.id, src=0, kind=Kind.UPDATE, job=1))
        assert same_job.recv(timeout=5) is not None
    finally:
        for e in (sender, same_job, other_job):
            e.close()


def test_frames_to_unknown_ids_or_with_a_forged_source_are_dropped_and_counted(
    router: bpf.RouterServer,
) -> None:
    a, b = join(router, 3), join(router, 3)
    try:
        a.send(Frame(dst=0xFFFF_0000, src=0, kind=Kind.PING, job=3))
        a.send(Frame(dst=b.id, src=b.id, kind=Kind.PING, job=3))  # pretends to be b
        assert b.recv(timeout=0.2) is None
        drops = router.drops()
        assert drops["unknown_dst"] == 1 and drops["spoofed_src"] == 1
        assert router.metrics()[a.id].drops == 2
        a.send(Frame(dst=b.id, src=a.id, kind=Kind.PING, job=3))
        assert b.recv(timeout=5) is not None
    finally:
        a.close()
        b.close()


def test_metrics_match_the_messages_sent(router: bpf.RouterServer) -> None:
    a, b = join(router, 4), join(router, 4)
    try:
        t0 = time.monotonic_ns()
        for seq in range(50):
            a.send(Frame(dst=b.id, src=0, kind=Kind.TASK, job=4, seq=seq))
        got = [b.recv(timeout=5) for _ in range(50)]
        for seq in range(20):
            b.send(Frame(dst=a.id, src=0, kind=Kind.ACK, job=4, seq=seq))
        acks = [a.recv(timeout=5) for _ in range(20)]
        t1 = time.monotonic_ns()
        assert [f.seq for f in got if f] == list(range(50))
        assert [f.seq for f in acks if f] == list(range(20))
        m = router.metrics()
        assert (m[a.id].msgs_sent, m[a.id].bytes_sent) == (50, 50 * 64)
        assert (m[a.id].msgs_received, m[a.id].bytes_received) == (20, 20 * 64)
        assert (m[b.id].msgs_sent, m[b.id].msgs_received) == (20, 50)
        assert t0 <= m[a.id].last_send_ns <= t1 and t0 <= m[b.id].last_recv_ns <= t1
        assert m[a.id].drops == 0 and sum(router.drops().values()) == 0
    finally:
        a.close()
        b.close()


def test_exec_time_spans_first_update_received_to_partial_sent(router: bpf.RouterServer) -> None:
    gw = router.local_endpoint(5)
    leaf, top = join(router, 5), join(router, 5)
    try:
        t_first = time.monotonic_ns()
        for _ in range(3):
            gw.send(Frame(dst=leaf.id, src=0, kind=Kind.UPDATE, job=5, weight=1.0))
        for _ in range(3):
            assert leaf.recv(timeout=5) is not None
        assert router.metrics()[leaf.id].task_open
        time.sleep(0.02)
        leaf.send(Frame(dst=top.id, src=0, kind=Kind.PARTIAL, job=5, weight=3.0, count=3))
        assert top.recv(timeout=5) is not None
        t_delivered = time.monotonic_ns()  # the router counts the PARTIAL before delivery
        m = router.metrics()[leaf.id]
        assert m.tasks_completed == 1 and not m.task_open
        assert m.exec_ns is not None and 20_000_000 <= m.exec_ns <= t_delivered - t_first
        assert m.result_sent_ns - m.first_update_recv_ns == m.exec_ns
    finally:
        for e in (gw, leaf, top):
            e.close()


def test_closed_endpoint_disappears_with_its_metrics_and_is_reported(
    router: bpf.RouterServer, disconnects: Disconnects
) -> None:
    a, b = join(router, 6), join(router, 6)
    a.send(Frame(dst=b.id, src=0, kind=Kind.UPDATE, job=6))
    assert b.recv(timeout=5) is not None
    gone = b.id
    b.close()
    assert _wait_until(lambda: gone not in router.endpoints())
    assert gone not in router.metrics()
    assert disconnects == [gone]
    a.send(Frame(dst=gone, src=0, kind=Kind.UPDATE, job=6))  # refused, not delivered
    assert _wait_until(lambda: router.drops()["unknown_dst"] + router.drops()["undeliverable"] == 1)
    a.close()


def test_killed_endpoint_process_is_removed(
    router: bpf.RouterServer, disconnects: Disconnects, repo_root: Path
) -> None:
    code = (
        "import sys, time, bpf\n"
        f"ep = bpf.connect({router.socket_path!r})\n"
        "print(ep.id, flush=True)\n"
        "grant = ep.recv(timeout=10)\n"
        "print(grant.kind.name, ep.job, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=repo_root
    )
    try:
        assert child.stdout is not None
        child_id = int(child.stdout.readline())
        router.grant(child_id, 8, os.path.dirname(router.socket_path))
        assert child.stdout.readline().split() == ["GRANT", "8"]
        info = router.endpoints()[child_id]
        assert info.pid == child.pid and info.uid == os.getuid() and info.job == 8
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert _wait_until(lambda: child_id not in router.endpoints())
        assert child_id not in router.metrics()
        assert disconnects == [child_id]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_frames_cross_process_boundaries(router: bpf.RouterServer, repo_root: Path) -> None:
    gw = router.local_endpoint(9)
    code = (
        "import sys, bpf\n"
        f"ep = bpf.connect({router.socket_path!r})\n"
        "print(ep.id, flush=True)\n"
        "grant = ep.recv(timeout=10)\n"
        "assert grant.kind is bpf.Kind.GRANT and ep.job == 9, grant\n"
        f"ep.send(bpf.Frame(dst={gw.id}, src=0, kind=bpf.Kind.PING, job=9))\n"
        "f = ep.recv(timeout=10)\n"
        f"ep.send(bpf.Frame(dst={gw.id}, src=0, kind=bpf.Kind.RESULT, job=9, key=f.key))\n"
        "ep.close()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=repo_root
    )
    try:
        assert child.stdout is not None
        child_id = int(child.stdout.readline())
        router.grant(child_id, 9, os.path.dirname(router.socket_path))
        ping = gw.recv(timeout=10)
        assert ping is not None and ping.kind is Kind.PING and ping.src == child_id
        gw.send(Frame(dst=ping.src, src=0, kind=Kind.TASK, job=9, key=b"k" * 16))
        result = gw.recv(timeout=10)
        assert result is not None and result.kind is Kind.RESULT and result.key == b"k" * 16
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        gw.close()


def test_recv_times_out_with_none(router: bpf.RouterServer) -> None:
    with join(router, 10) as ep:
        t0 = time.monotonic()
        assert ep.recv(timeout=0.1) is None
        assert time.monotonic() - t0 >= 0.09


def test_endpoint_learns_when_the_router_stops(router: bpf.RouterServer) -> None:
    ep = join(router, 11)
    gw = router.local_endpoint(11)
    router.stop()
    for endpoint in (ep, gw):
        with pytest.raises(bpf.EndpointClosed):
            endpoint.recv(timeout=5)
        endpoint.close()
    with pytest.raises(bpf.EndpointClosed):
        ep.send(Frame(dst=1, src=0, kind=Kind.PING))


def test_prometheus_collector_exports_mode_counters_and_drops(router: bpf.RouterServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    a, b = join(router, 12), join(router, 12)
    try:
        a.send(Frame(dst=b.id, src=0, kind=Kind.UPDATE, job=12))
        assert b.recv(timeout=5) is not None
        registry = CollectorRegistry()
        registry.register(bpf.prometheus_collector(router))
        text = generate_latest(registry).decode()
        assert f'fedfaas_router_mode{{mode="{router.mode}"' in text
        assert (
            f'fedfaas_router_messages_sent_total{{endpoint="{a.id}",job="12",role="aggregator"}} 1.0'
            in text
        )
        assert 'fedfaas_router_drops_total{reason="cross_job"} 0.0' in text
        status = router.status()
        assert status["mode"] == router.mode
        assert {e["id"] for e in status["endpoints"]} == {a.id, b.id}
    finally:
        a.close()
        b.close()


def test_a_peer_stuck_in_registration_stalls_neither_frames_nor_other_registrations(
    router: bpf.RouterServer,
) -> None:
    import socket

    a, b = join(router, 13), join(router, 13)
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stuck.connect(router.socket_path)  # never says hello
    try:
        t0 = time.monotonic()
        a.send(Frame(dst=b.id, src=0, kind=Kind.UPDATE, job=13))
        assert b.recv(timeout=5) is not None
        with join(router, 13) as c:
            assert c.id in router.endpoints()
        assert time.monotonic() - t0 < 1.5  # well inside the 2 s handshake timeout
    finally:
        stuck.close()
        a.close()
        b.close()
