"""Registration protocol between an endpoint and the router, over a Unix SOCK_SEQPACKET socket.

1. endpoint -> router  HELLO   magic, version, job, role
2. router -> endpoint  WELCOME magic, status, mode, endpoint id, then a reason (utf-8) if refused
3. eBPF mode only: endpoint -> router ATTACH (magic, id) with its data socket as SCM_RIGHTS;
   router -> endpoint READY (magic, status, reason).

After that the registration socket stays open: its EOF tells the router the endpoint is gone.
In userspace mode it is also the data channel (one 64-byte frame per record).
"""

from __future__ import annotations

import array
import contextlib
import socket
import struct

from bpf.errors import RegistrationRefused

VERSION = 1
MODE_EBPF = 1
MODE_USERSPACE = 2
MODES = {MODE_EBPF: "ebpf", MODE_USERSPACE: "userspace"}
ROLE_BYTES = 32

_HELLO = struct.Struct("<4sHHI32s")
_WELCOME = struct.Struct("<4sHHI")
_ATTACH = struct.Struct("<4sI")
_READY = struct.Struct("<4sHH")
_HELLO_MAGIC = b"FFRH"
_WELCOME_MAGIC = b"FFRW"
_ATTACH_MAGIC = b"FFRA"
_READY_MAGIC = b"FFRR"
_PEERCRED = struct.Struct("3i")
MAX_RECORD = 512


def encode_hello(job: int, role: str) -> bytes:
    raw = role.encode()
    if len(raw) > ROLE_BYTES:
        raise ValueError(f"role is at most {ROLE_BYTES} bytes, got {role!r}")
    return _HELLO.pack(_HELLO_MAGIC, VERSION, 0, job, raw)


def decode_hello(buf: bytes) -> tuple[int, str]:
    """Return ``(job, role)`` or raise RegistrationRefused."""
    if len(buf) != _HELLO.size:
        raise RegistrationRefused(f"hello must be {_HELLO.size} bytes, got {len(buf)}")
    magic, version, _flags, job, role = _HELLO.unpack(buf)
    if magic != _HELLO_MAGIC or version != VERSION:
        raise RegistrationRefused(f"bad hello magic/version {magic!r}/{version}")
    try:
        return job, role.rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise RegistrationRefused("role is not utf-8") from None


def encode_welcome(mode: int, endpoint_id: int, reason: str = "") -> bytes:
    status = 0 if endpoint_id else 1
    return _WELCOME.pack(_WELCOME_MAGIC, status, mode, endpoint_id) + reason.encode()[:400]


def decode_welcome(buf: bytes) -> tuple[int, int]:
    """Return ``(mode, endpoint_id)`` or raise RegistrationRefused with the router's reason."""
    if len(buf) < _WELCOME.size:
        raise RegistrationRefused("router closed the registration socket without an answer")
    magic, status, mode, endpoint_id = _WELCOME.unpack_from(buf)
    if magic != _WELCOME_MAGIC:
        raise RegistrationRefused(f"bad welcome magic {magic!r}")
    if status != 0:
        raise RegistrationRefused(buf[_WELCOME.size :].decode(errors="replace"))
    if mode not in MODES:
        raise RegistrationRefused(f"router announced unknown mode {mode}")
    return mode, endpoint_id


def encode_attach(endpoint_id: int) -> bytes:
    return _ATTACH.pack(_ATTACH_MAGIC, endpoint_id)


def decode_attach(buf: bytes) -> int:
    if len(buf) != _ATTACH.size or buf[:4] != _ATTACH_MAGIC:
        raise RegistrationRefused("expected ATTACH with the data socket")
    return int(_ATTACH.unpack(buf)[1])


def encode_ready(reason: str = "") -> bytes:
    return _READY.pack(_READY_MAGIC, 1 if reason else 0, 0) + reason.encode()[:400]


def decode_ready(buf: bytes) -> None:
    if len(buf) < _READY.size or buf[:4] != _READY_MAGIC:
        raise RegistrationRefused("router closed the registration socket during attach")
    if _READY.unpack_from(buf)[1] != 0:
        raise RegistrationRefused(buf[_READY.size :].decode(errors="replace"))


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def send_with_fd(sock: socket.socket, payload: bytes, fd: int) -> None:
    """Send one record carrying ``fd`` as SCM_RIGHTS."""
    fds = array.array("i", [fd])
    sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])


def recv_with_fd(sock: socket.socket) -> tuple[bytes, int | None]:
    """Receive one record and at most one SCM_RIGHTS fd (extra fds are closed)."""
    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(MAX_RECORD, socket.CMSG_SPACE(4 * fds.itemsize))
    received: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % fds.itemsize
            received.extend(array.array("i", data[:usable]))
    for extra in received[1:]:
        _close_fd(extra)
    return msg, (received[0] if received else None)


def loopback_tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair; the listener exists only until the accept returns."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            client.connect(listener.getsockname())
            server, peer = listener.accept()
            if peer != client.getsockname():  # someone else raced onto the short-lived port
                server.close()
                raise OSError(f"loopback pair: unexpected peer {peer!r}")
        except BaseException:
            client.close()
            raise
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


def _close_fd(fd: int) -> None:
    import os

    with contextlib.suppress(OSError):
        os.close(fd)
