"""Grants: endpoints register in no job; only the gateway (``RouterServer.grant``) gives one.

Run against the userspace router and the eBPF sidecar alike (the ``router`` fixture).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import bpf
from bpf import Frame, Kind, protocol

from .conftest import BACKENDS, join

pytestmark = pytest.mark.integration


def _wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def _store(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def _take_grant(ep: bpf.Endpoint, job: int) -> Frame:
    grant = ep.recv(timeout=5)
    assert grant is not None and grant.kind is Kind.GRANT, grant
    assert (grant.dst, grant.src, grant.job, ep.job) == (ep.id, 0, job, job), grant
    return grant


def _fds_on(path: Path) -> list[int]:
    """This process's open fds that refer to ``path``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                found.append(int(name))
        except OSError:
            continue  # the listing's own fd, gone by now
    return found


def _is_closed_or_elsewhere(fd: int, path: Path) -> bool:
    """True when ``fd`` no longer refers to ``path`` (closed, or the number was reused)."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    here = os.stat(path)
    return (st.st_ino, st.st_dev) != (here.st_ino, here.st_dev)


def test_fresh_endpoint_is_in_no_job_and_gets_frames_only_once_granted(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    gw = router.local_endpoint(1)
    ep = bpf.connect(router.socket_path)
    try:
        assert (ep.job, ep.store_fd) == (0, None)
        assert router.endpoints()[ep.id].job == 0
        gw.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1, seq=1))
        assert ep.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 1)
        ep.send(Frame(dst=gw.id, src=0, kind=Kind.PING, job=1))  # nor may it reach job 1
        assert gw.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 2)

        router.grant(ep.id, 1, str(_store(tmp_path, "job-1")))
        _take_grant(ep, 1)
        assert router.endpoints()[ep.id].job == 1
        gw.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1, seq=2))
        got = ep.recv(timeout=5)
        assert got is not None and (got.kind, got.src, got.seq) == (Kind.TASK, gw.id, 2)
        ep.send(Frame(dst=gw.id, src=0, kind=Kind.PING, job=1))
        back = gw.recv(timeout=5)
        assert back is not None and back.src == ep.id
        assert router.drops()["cross_job"] == 2
    finally:
        ep.close()
        gw.close()


def test_grant_carries_the_store_folder_as_a_directory_fd(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    store = _store(tmp_path, "job-3")
    (store / "obj").write_bytes(b"weights")
    with bpf.connect(router.socket_path) as ep:
        router.grant(ep.id, 3, str(store), role="leaf")
        _take_grant(ep, 3)
        assert ep.store_fd is not None
        st, want = os.fstat(ep.store_fd), os.stat(store)
        assert stat.S_ISDIR(st.st_mode)
        assert (st.st_ino, st.st_dev) == (want.st_ino, want.st_dev)
        fd = os.open("obj", os.O_RDONLY, dir_fd=ep.store_fd)  # objects open relative to it
        try:
            assert os.read(fd, 16) == b"weights"
        finally:
            os.close(fd)
        assert router.endpoints()[ep.id].role == "leaf"
        assert _fds_on(store) == [ep.store_fd]  # the router kept no copy


def test_regrant_moves_the_endpoint_to_the_new_job_and_replaces_the_store_fd(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    store1, store2 = _store(tmp_path, "job-1"), _store(tmp_path, "job-2")
    gw1, gw2 = router.local_endpoint(1), router.local_endpoint(2)
    ep = bpf.connect(router.socket_path)
    try:
        router.grant(ep.id, 1, str(store1))
        _take_grant(ep, 1)
        old_fd = ep.store_fd
        assert old_fd is not None and _fds_on(store1) == [old_fd]
        gw1.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1, seq=1))
        got = ep.recv(timeout=5)
        assert got is not None and got.src == gw1.id

        router.grant(ep.id, 2, str(store2))
        _take_grant(ep, 2)
        assert router.endpoints()[ep.id].job == 2
        assert ep.store_fd is not None and ep.store_fd != old_fd
        st, want = os.fstat(ep.store_fd), os.stat(store2)
        assert (st.st_ino, st.st_dev) == (want.st_ino, want.st_dev)
        assert _is_closed_or_elsewhere(old_fd, store1)
        assert _fds_on(store1) == []  # the old job's folder is no longer reachable

        gw1.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1, seq=2))
        assert ep.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 1)
        gw2.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=2, seq=3))
        got = ep.recv(timeout=5)
        assert got is not None and (got.src, got.seq) == (gw2.id, 3)
        ep.send(Frame(dst=gw1.id, src=0, kind=Kind.PARTIAL, job=1))  # its old job is closed
        assert gw1.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 2)
        ep.send(Frame(dst=gw2.id, src=0, kind=Kind.PARTIAL, job=2))
        back = gw2.recv(timeout=5)
        assert back is not None and back.src == ep.id
    finally:
        for e in (ep, gw1, gw2):
            e.close()


def test_revoking_the_grant_drops_the_jobs_frames_and_closes_the_store_fd(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    gw = router.local_endpoint(1)
    store = tmp_path  # join grants the router socket's folder, which is tmp_path
    ep = join(router, 1)
    try:
        old_fd = ep.store_fd
        assert old_fd is not None
        router.grant(ep.id, 0, None)
        _take_grant(ep, 0)
        assert ep.store_fd is None
        assert router.endpoints()[ep.id].job == 0
        assert _is_closed_or_elsewhere(old_fd, store)
        assert _fds_on(store) == []
        gw.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1))
        assert ep.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 1)
        ep.send(Frame(dst=gw.id, src=0, kind=Kind.PARTIAL, job=1))
        assert gw.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["cross_job"] == 2)
        assert router.metrics()[ep.id].drops == 1
    finally:
        ep.close()
        gw.close()


def test_hello_that_names_a_job_is_refused_and_the_router_keeps_serving(
    router: bpf.RouterServer,
) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        raw.settimeout(5)
        raw.connect(router.socket_path)
        raw.sendall(protocol.encode_hello(5, "x"))
        with pytest.raises(bpf.RegistrationRefused) as refused:
            protocol.decode_welcome(raw.recv(protocol.MAX_RECORD))
        assert "job 5" in refused.value.reason and "grant" in refused.value.reason
        assert raw.recv(protocol.MAX_RECORD) == b""  # and the router hung up
    finally:
        raw.close()
    assert router.endpoints() == {}
    with bpf.connect(router.socket_path) as ep:
        assert set(router.endpoints()) == {ep.id} and ep.job == 0


def test_an_endpoint_gone_before_its_welcome_is_a_disconnect_the_gateway_hears_of(
    tmp_path: Path,
) -> None:
    """Userspace routing admits an endpoint (listed, routable, grantable) before it answers
    the hello; if that answer fails the endpoint is gone, and on_disconnect must say so, or a
    slot the gateway gave it in between waits forever."""
    gone: list[int] = []
    router = bpf.RouterServer(
        str(tmp_path / "router.sock"), prefer_ebpf=False, on_disconnect=gone.append
    ).start()
    try:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        raw.connect(router.socket_path)
        raw.sendall(protocol.encode_hello(0, "hasty"))
        raw.close()  # before the router has answered
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(gone) == 1 and router.endpoints() == {}
        with bpf.connect(router.socket_path) as ep:  # and the router keeps serving
            assert set(router.endpoints()) == {ep.id}
    finally:
        router.stop()


@pytest.mark.parametrize("forged_src", [False, True], ids=["own_src", "router_src"])
def test_grant_frame_sent_by_an_endpoint_is_dropped_as_spoofed(
    router: bpf.RouterServer, tmp_path: Path, forged_src: bool
) -> None:
    a, b = join(router, 1), join(router, 1)
    try:
        fd_before = b.store_fd
        grant = Frame(dst=b.id, src=0, kind=Kind.GRANT, job=2)
        if forged_src:
            # src 0 is the router's own: written on the data socket, past Endpoint.send
            a._data.sendall(grant.encode())
        else:
            a.send(grant)  # send stamps a's id
        assert b.recv(timeout=0.3) is None
        assert _wait_until(lambda: router.drops()["spoofed_src"] == 1)
        assert router.metrics()[a.id].drops == 1
        assert router.metrics()[b.id].msgs_received == 0
        assert (b.job, b.store_fd) == (1, fd_before)
        assert router.endpoints()[b.id].job == 1
        a.send(Frame(dst=b.id, src=0, kind=Kind.PING, job=1))  # a's socket still works
        got = b.recv(timeout=5)
        assert got is not None and (got.kind, got.src) == (Kind.PING, a.id)
        assert router.drops()["spoofed_src"] == 1
    finally:
        a.close()
        b.close()


def test_grant_of_an_unknown_or_local_endpoint_raises_router_error(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    gw = router.local_endpoint(1)
    try:
        with pytest.raises(bpf.RouterError, match="not a registered function endpoint"):
            router.grant(0xFFFF_0000, 1, str(tmp_path))
        with pytest.raises(bpf.RouterError, match="not a registered function endpoint"):
            router.grant(gw.id, 2, str(tmp_path))
        assert router.endpoints()[gw.id].job == 1 and gw.job == 1
        assert set(router.endpoints()) == {gw.id}
        assert _fds_on(tmp_path) == []  # the folder opened for the grant was closed
    finally:
        gw.close()


def test_grant_written_on_the_registration_socket_grants_nothing(
    router: bpf.RouterServer, tmp_path: Path
) -> None:
    a, b = join(router, 1), join(router, 1)
    try:
        fd_before = b.store_fd
        for dst in (a.id, b.id):  # for itself, or for another endpoint
            raw = Frame(dst=dst, src=0, kind=Kind.GRANT, job=2).encode()
            assert a._control is not None
            a._control.sendall(raw)  # the router's channel, the wrong way round
        assert b.recv(timeout=0.3) is None
        assert a.recv(timeout=0.3) is None
        assert (a.job, b.job, b.store_fd) == (1, 1, fd_before)
        assert {e: i.job for e, i in router.endpoints().items()} == {a.id: 1, b.id: 1}
        a.send(Frame(dst=b.id, src=0, kind=Kind.PING, job=1))  # a is still registered
        got = b.recv(timeout=5)
        assert got is not None and (got.kind, got.src) == (Kind.PING, a.id)
    finally:
        a.close()
        b.close()


# eBPF only: in userspace mode the data socket is the registration socket (the router's own)
@pytest.mark.parametrize("backend", [BACKENDS[1]], indirect=True)
def test_grant_arriving_on_the_data_socket_is_discarded_by_the_endpoint(
    router: bpf.RouterServer,
) -> None:
    ep = join(router, 1)
    gw = router.local_endpoint(1)
    try:
        fd_before = ep.store_fd
        # the TCP peer of the data socket is outside the sockhash: no verdict runs on it
        ep._keep[0].sendall(Frame(dst=ep.id, src=0, kind=Kind.GRANT, job=2).encode())
        assert ep.recv(timeout=0.5) is None  # read and dropped, not returned
        with pytest.raises(BlockingIOError):  # ... and nothing of it is left to read
            ep._data.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        assert (ep.job, ep.store_fd) == (1, fd_before)
        gw.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=1, seq=7))
        got = ep.recv(timeout=5)
        assert got is not None and (got.kind, got.seq) == (Kind.TASK, 7)
        assert (ep.job, ep.store_fd) == (1, fd_before)
    finally:
        ep.close()
        gw.close()
