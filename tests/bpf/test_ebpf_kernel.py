"""The eBPF sidecar on the real kernel: loads, routes without the router process, cleans up."""

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
from bpf.loader import cflags, final_source, main
from tests.commands import run_module

from .conftest import ebpf_probe, join


def test_final_source_carries_the_constants_as_defines(capsys: pytest.CaptureFixture[str]) -> None:
    text = final_source(128)
    assert "#define FRAME_SIZE 64\n" in text and "#define MAX_ENDPOINTS 128\n" in text
    assert "#define KIND_UPDATE 1\n" in text and "int sidecar_router(struct sk_msg_md *msg)" in text
    assert "#define KIND_GRANT 8\n" in text
    assert "-DSINK_ID=0" in cflags()
    assert main(["--ebpf"]) == 0
    assert "BPF_SOCKHASH(socks" in capsys.readouterr().out


def _require_ebpf() -> None:
    mode, reason = ebpf_probe()
    if mode != "ebpf":
        pytest.skip(f"eBPF sidecar cannot load on this machine: {reason}")


@pytest.mark.bpf
def test_probe_reports_ebpf_where_the_program_loads() -> None:
    _require_ebpf()
    mode, reason = bpf.probe()
    assert mode == "ebpf" and os.uname().release in reason


@pytest.mark.bpf
def test_loader_self_check_routes_frames_through_the_kernel() -> None:
    _require_ebpf()
    out = run_module("bpf.loader", "--count", "200")
    assert out.returncode == 0, out.stderr
    assert "200 frames routed 1 -> 2" in out.stdout
    assert "msgs_sent=200" in out.stdout and "msgs_received=200" in out.stdout


def _wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return True
        time.sleep(0.005)
    return False


_ROUTER = """
import os, sys, bpf
router = bpf.RouterServer(sys.argv[1], prefer_ebpf=sys.argv[2] == "ebpf").start()
print(router.mode, flush=True)
for line in sys.stdin:  # one endpoint id a line: grant it job 1
    router.grant(int(line), 1, os.path.dirname(sys.argv[1]))
    print("granted", int(line), flush=True)
"""


@pytest.mark.bpf
@pytest.mark.integration
@pytest.mark.parametrize("backend", ["ebpf", "userspace"])
def test_only_the_kernel_routes_while_the_router_process_is_stopped(
    backend: str, tmp_path: Path, repo_root: Path
) -> None:
    if backend == "ebpf":
        _require_ebpf()
    path = str(tmp_path / "router.sock")
    proc = subprocess.Popen(
        [sys.executable, "-c", _ROUTER, path, backend],
        cwd=repo_root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == backend
        a, b = bpf.connect(path), bpf.connect(path)
        for ep in (a, b):  # the router process grants job 1 to each
            proc.stdin.write(f"{ep.id}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().split() == ["granted", str(ep.id)]
            grant = ep.recv(timeout=5)
            assert grant is not None and grant.kind is Kind.GRANT and ep.job == 1
        proc.send_signal(signal.SIGSTOP)  # the router process gets no CPU from here on
        assert _wait_stopped(proc.pid)
        a.send(Frame(dst=b.id, src=0, kind=Kind.UPDATE, job=1, key=b"q" * 16))
        got = b.recv(timeout=0.5)
        if backend == "ebpf":
            assert got is not None and got.key == b"q" * 16
        else:
            assert got is None  # userspace forwarding needs the router's thread
        proc.send_signal(signal.SIGCONT)
        if backend == "userspace":
            late = b.recv(timeout=5)
            assert late is not None and late.key == b"q" * 16
        a.close()
        b.close()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.bpf
@pytest.mark.integration
def test_router_stop_unloads_and_endpoints_learn_it(tmp_path: Path) -> None:
    _require_ebpf()
    router = bpf.RouterServer(str(tmp_path / "r.sock")).start()
    assert router.mode == "ebpf"
    a = join(router, 1)
    router.stop()
    assert not os.path.exists(router.socket_path)
    with pytest.raises(bpf.EndpointClosed):
        a.recv(timeout=5)
    a.close()


@pytest.mark.bpf
@pytest.mark.integration
def test_many_endpoints_each_get_their_own_frames(tmp_path: Path) -> None:
    _require_ebpf()
    with bpf.RouterServer(str(tmp_path / "r.sock")) as router:
        gw = router.local_endpoint(3)
        eps = [join(router, 3) for _ in range(40)]
        t0 = time.monotonic()
        for round_ in range(5):
            for ep in eps:
                gw.send(Frame(dst=ep.id, src=0, kind=Kind.TASK, job=3, round=round_, parent=ep.id))
        for ep in eps:
            frames = [ep.recv(timeout=5) for _ in range(5)]
            assert [f.round for f in frames if f] == [0, 1, 2, 3, 4]
            assert all(f is not None and f.parent == ep.id for f in frames)
        assert time.monotonic() - t0 < 30
        assert router.metrics()[gw.id].msgs_sent == 200
        for ep in eps:
            ep.close()
        gw.close()


@pytest.mark.bpf
def test_kernel_drops_a_closed_socket_from_the_sockhash_and_remove_clears_the_rest() -> None:
    _require_ebpf()
    from bpf.loader import SidecarProgram
    from bpf.protocol import loopback_tcp_pair

    prog = SidecarProgram.load()
    try:
        sock, peer = loopback_tcp_pair()
        other, other_peer = loopback_tcp_pair()
        prog.add_endpoint(5, 1, sock.fileno())
        prog.add_endpoint(6, 1, other.fileno())
        assert prog.socket_ids() == {5, 6}
        assert set(prog.metrics()) == {5, 6}
        sock.close()
        peer.close()
        assert prog.socket_ids() == {6}  # gone with the socket, before anyone calls remove
        prog.remove_endpoint(5)
        assert set(prog.metrics()) == {6}
        prog.remove_endpoint(6)
        assert prog.socket_ids() == set() and prog.metrics() == {}
        other.close()
        other_peer.close()
    finally:
        prog.close()


@pytest.mark.bpf
@pytest.mark.integration
def test_attach_with_something_that_is_not_a_tcp_socket_is_refused(tmp_path: Path) -> None:
    _require_ebpf()
    import socket

    from bpf import protocol

    with bpf.RouterServer(str(tmp_path / "r.sock")) as router:
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ctl.settimeout(5)
        ctl.connect(router.socket_path)
        ctl.sendall(protocol.encode_hello(0, "liar"))
        mode, endpoint_id = protocol.decode_welcome(ctl.recv(512))
        assert mode == protocol.MODE_EBPF
        r, w = os.pipe()
        try:
            protocol.send_with_fd(ctl, protocol.encode_attach(endpoint_id), r)
            with pytest.raises(bpf.RegistrationRefused, match="sender storage|sockhash"):
                protocol.decode_ready(ctl.recv(512))
        finally:
            os.close(r)
            os.close(w)
            ctl.close()
        assert router.endpoints() == {} and router.metrics() == {}
        with bpf.connect(router.socket_path) as ep:  # the router still serves
            assert set(router.endpoints()) == {ep.id}
