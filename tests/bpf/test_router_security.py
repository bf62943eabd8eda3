"""Registration checks its peer; a router that cannot load eBPF says why and still routes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import bpf
import bpf.ebpf_router  # noqa: F401  (imported before fork: the child cannot read the venv)
from bpf import Frame, Kind

from .conftest import join

pytestmark = pytest.mark.integration

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")


def _as_nobody(work: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Run ``work`` in a forked child that dropped to uid/gid 65534; return its JSON answer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = work()
        except BaseException as exc:  # reported to the parent, never raised in the fork
            answer = {"error": f"{type(exc).__name__}: {exc}"}
            code = 1
        os.write(w, json.dumps(answer).encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A directory another uid can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="fedfaas-bpf-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_router_socket_is_private_to_its_owner(router: bpf.RouterServer) -> None:
    assert oct(os.stat(router.socket_path).st_mode & 0o777) == "0o600"


@needs_root
def test_registration_from_another_uid_is_refused_with_the_reason(
    router: bpf.RouterServer,
) -> None:
    os.chmod(router.socket_path, 0o666)  # let the other uid reach SO_PEERCRED, the real check
    os.chmod(os.path.dirname(router.socket_path), 0o777)
    for parent in Path(router.socket_path).parents:
        if str(parent).startswith("/tmp/pytest-of-"):
            parent.chmod(parent.stat().st_mode | 0o711)

    def attempt() -> dict[str, object]:
        try:
            bpf.connect(router.socket_path)
        except bpf.RegistrationRefused as exc:
            return {"refused": exc.reason}
        return {"refused": None}

    answer = _as_nobody(attempt)
    assert "uid 65534" in str(answer.get("refused")), answer
    assert router.endpoints() == {}


@needs_root
def test_router_without_root_falls_back_to_userspace_and_says_why(shared_dir: Path) -> None:
    def run_router() -> dict[str, object]:
        router = bpf.RouterServer(str(shared_dir / "r.sock"), prefer_ebpf=True).start()
        try:
            a, b = join(router, 1), join(router, 1)
            a.send(Frame(dst=b.id, src=0, kind=Kind.UPDATE, job=1))
            got = b.recv(timeout=5)
            a.close()
            b.close()
            return {
                "mode": router.mode,
                "reason": router.reason,
                "probe": list(bpf.probe()),
                "delivered": got is not None and got.src == a.id,
            }
        finally:
            router.stop()

    answer = _as_nobody(run_router)
    assert answer.get("mode") == "userspace", answer
    assert "not root" in str(answer["reason"])
    assert answer["probe"][0] == "userspace" and "not root" in answer["probe"][1]
    assert answer["delivered"] is True


def test_router_that_is_asked_for_userspace_says_so(tmp_path: Path) -> None:
    with bpf.RouterServer(str(tmp_path / "r.sock"), prefer_ebpf=False) as router:
        assert router.mode == "userspace"
        assert "prefer_ebpf=False" in router.reason


def test_second_router_on_the_same_socket_is_refused(tmp_path: Path) -> None:
    with (
        bpf.RouterServer(str(tmp_path / "r.sock"), prefer_ebpf=False),
        pytest.raises(bpf.RouterError, match="another router"),
    ):
        bpf.RouterServer(str(tmp_path / "r.sock"), prefer_ebpf=False).start()


def test_stale_socket_file_of_a_dead_router_is_replaced(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "r.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    with bpf.RouterServer(str(path), prefer_ebpf=False) as router, bpf.connect(str(path)) as ep:
        assert ep.id in router.endpoints()


def test_garbage_hello_is_refused_and_router_keeps_serving(tmp_path: Path) -> None:
    import socket

    with bpf.RouterServer(str(tmp_path / "r.sock"), prefer_ebpf=False) as router:
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        bad.settimeout(5)
        bad.connect(router.socket_path)
        bad.send(b"hello, router")
        with pytest.raises(bpf.RegistrationRefused, match="hello must be"):
            from bpf.protocol import decode_welcome

            decode_welcome(bad.recv(512))
        bad.close()
        with bpf.connect(router.socket_path) as ep:
            assert ep.id in router.endpoints()


@needs_root
def test_router_without_kernel_headers_falls_back_and_names_the_missing_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.uname()
    fake = os.uname_result((*real[:2], "0.0.0-no-such-kernel", *real[3:]))
    monkeypatch.setattr(os, "uname", lambda: fake)
    with bpf.RouterServer(str(tmp_path / "r.sock")) as router:
        assert router.mode == "userspace"
        assert "/lib/modules/0.0.0-no-such-kernel/build" in router.reason
    assert bpf.probe(load=False) == (
        "userspace",
        "kernel 0.0.0-no-such-kernel is older than 5.15 (needs sk_msg_md->sk and socket "
        "storage from SK_MSG)",
    )


def test_kernel_release_strings_parse_to_major_minor() -> None:
    from bpf.probe import _kernel_version

    assert _kernel_version("6.18.44-fc-v769") == (6, 18)
    assert _kernel_version("5.15.0-91-generic") == (5, 15)
    assert _kernel_version("4.19rc1") == (4, 19)
    assert _kernel_version("garbage") == (0, 0)
