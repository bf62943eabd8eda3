"""The function side of the router: :func:`connect` registers and returns an :class:`Endpoint`."""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from bpf.errors import EndpointClosed, FrameError, RegistrationRefused
from bpf.frame import FRAME_SIZE, Frame, Kind
from bpf.protocol import (
    MAX_RECORD,
    MODE_EBPF,
    MODES,
    decode_ready,
    decode_welcome,
    encode_attach,
    encode_hello,
    loopback_tcp_pair,
    send_with_fd,
)

log = logging.getLogger(__name__)

_READ_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
#: How long :meth:`Endpoint.recv` polls without sleeping before it blocks. Frames come in bursts
#: (a TASK and its inputs, an ACK and the next frame it paces); a receiver that went to sleep
#: is woken by an interrupt to an idle CPU, which costs 20-30 us on a virtual machine against
#: about 7 us for a frame to a receiver still running (measured here). The spin is bounded,
#: so an idle endpoint costs at most this much CPU per wait.
SPIN_NS = 60_000
_ANC_SPACE = socket.CMSG_SPACE(4)


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class Endpoint:
    """One registered endpoint: sends frames to other endpoints of its job, receives its own.

    Get one from :func:`connect` (a function replica) or :meth:`RouterServer.local_endpoint`
    (the gateway). In eBPF mode the data socket is a loopback TCP socket in the kernel's
    SOCKHASH and frames never pass through the router process; in userspace mode it is the
    registration socket itself and the router thread forwards each frame.
    """

    def __init__(
        self,
        endpoint_id: int,
        job: int,
        mode: str,
        data: socket.socket,
        *,
        control: socket.socket | None = None,
        keep: tuple[socket.socket, ...] = (),
        on_close: Callable[[int], None] | None = None,
    ) -> None:
        self.id = endpoint_id
        self.job = job
        self.mode = mode
        #: frames the kernel refused at send (eBPF mode reports drops to the sender as EACCES)
        self.refused = 0
        self._data = data
        self._control = control
        self._keep = keep
        self._on_close = on_close
        self._closed = False
        self._store_fd: int | None = None
        self._stream = data.type == socket.SOCK_STREAM
        self._rx = bytearray(FRAME_SIZE)
        self._rx_view = memoryview(self._rx)
        self._rx_have = 0
        self._ctl_view = memoryview(bytearray(FRAME_SIZE))  # the router's records (eBPF mode)
        self._send_lock = threading.Lock()
        #: see :data:`SPIN_NS`; 0 blocks at once
        self.spin_ns = SPIN_NS
        data.setblocking(True)
        self._poll = select.poll()
        self._poll.register(data.fileno(), _READ_EVENTS)
        if control is not None and control is not data:
            self._poll.register(control.fileno(), _READ_EVENTS)

    def __repr__(self) -> str:
        return f"Endpoint(id={self.id}, job={self.job}, mode={self.mode!r})"

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        """The data socket's fd: readable when a frame (or EOF) is waiting."""
        return self._data.fileno()

    def send(self, frame: Frame) -> None:
        """Send one frame. ``src`` 0 is replaced by this endpoint's id, ``t_ns`` 0 by now.

        Frames the router refuses (unknown destination, other job, spoofed source) are dropped
        and counted in the router's metrics (``RouterServer.drops()``); send does not raise
        for them.

        Raises
        ------
        EndpointClosed
            If this endpoint or the router is closed.
        """
        if self._closed:
            raise EndpointClosed(f"endpoint {self.id} is closed")
        raw = frame.encode_as(frame.src or self.id, frame.t_ns or time.monotonic_ns())
        try:
            with self._send_lock:
                self._data.sendall(raw)
        except (PermissionError, BrokenPipeError, ConnectionResetError) as exc:
            # eBPF mode: a redirect to a socket that died in flight fails the sender's sendmsg.
            if self._control is not self._data and self._router_alive():
                self.refused += 1
                log.debug("endpoint %d: frame to %d undeliverable: %s", self.id, frame.dst, exc)
                return
            raise EndpointClosed(f"endpoint {self.id}: router gone ({exc})") from exc

    def _router_alive(self) -> bool:
        if self._control is None:
            return True  # the gateway's own endpoint: the router is this process
        events = select.poll()
        events.register(self._control.fileno(), _READ_EVENTS)
        return not events.poll(0)

    @property
    def store_fd(self) -> int | None:
        """Directory fd of the granted job's object-store folder (None before a grant)."""
        return self._store_fd

    def recv(self, timeout: float | None = None) -> Frame | None:
        """Wait up to ``timeout`` seconds (None: forever) for the next frame.

        A GRANT from the router (see :meth:`RouterServer.grant`) is returned like any frame,
        after :attr:`job` and :attr:`store_fd` have taken its values.

        Returns
        -------
        Frame or None
            None when the timeout expires first.

        Raises
        ------
        EndpointClosed
            If the endpoint is closed or the router went away.
        """
        if self._closed:
            raise EndpointClosed(f"endpoint {self.id} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        data_fd = self._data.fileno()
        split = self._control is not None and self._control is not self._data
        while True:
            if split:
                # the router's own records first: a GRANT is sent before the TASK it enables
                grant = self._read_control()
                if grant is not None:
                    return grant
            if self._rx_have == 0 or self._stream:
                ready = self._spin()
                if not ready:
                    if deadline is None:
                        ready = self._poll.poll(-1)
                    else:
                        ready = self._poll.poll(max(0, int((deadline - time.monotonic()) * 1000)))
                        if not ready:
                            return None
                if split and any(fd != data_fd for fd, _ in ready):
                    # a GRANT may wait there: it was sent before any frame it enables
                    grant = self._read_control()
                    if grant is not None:
                        return grant
                if not any(fd == data_fd for fd, _ in ready):
                    continue
            try:
                if self._stream:
                    n = self._data.recv_into(
                        self._rx_view[self._rx_have :],
                        FRAME_SIZE - self._rx_have,
                        socket.MSG_DONTWAIT,
                    )
                    fd = None
                else:
                    n, fd = self._recv_record(self._data, self._rx_view)
            except BlockingIOError:
                continue
            except OSError as exc:
                if self._closed or exc.errno in (errno.EBADF, errno.ECONNRESET):
                    raise EndpointClosed(f"endpoint {self.id} closed ({exc})") from exc
                raise
            if n == 0:
                raise EndpointClosed(f"endpoint {self.id}: peer closed")
            self._rx_have += n
            if self._rx_have == FRAME_SIZE:
                self._rx_have = 0
                try:
                    frame = Frame.decode(self._rx)
                except FrameError:
                    log.warning("endpoint %d: undecodable frame discarded", self.id)
                    _close_fd(fd)
                    continue
                if frame.kind == Kind.GRANT:
                    # on a shared socket only the router's own record (src 0) grants
                    if split or frame.src != 0:
                        log.warning("endpoint %d: GRANT from %d discarded", self.id, frame.src)
                        _close_fd(fd)
                        continue
                    return self._take_grant(frame, fd)
                _close_fd(fd)
                return frame
            _close_fd(fd)
            if not self._stream:
                self._rx_have = 0  # a short record on a seqpacket socket: discard it
                log.warning("endpoint %d: short record (%d bytes) discarded", self.id, n)

    def _spin(self) -> list[tuple[int, int]]:
        """Poll without sleeping for up to :attr:`spin_ns`; what became ready, if anything."""
        if self.spin_ns <= 0:
            return []
        poll, now = self._poll.poll, time.monotonic_ns
        end = now() + self.spin_ns
        while True:
            ready = poll(0)
            if ready or now() >= end:
                return ready

    def _recv_record(self, sock: socket.socket, view: memoryview) -> tuple[int, int | None]:
        """One seqpacket record into ``view``, and the fd it carries (if any)."""
        n, anc, _flags, _addr = sock.recvmsg_into([view], _ANC_SPACE, socket.MSG_DONTWAIT)
        fds: list[int] = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % 4
                fds.extend(array.array("i", data[:usable]))
        for extra in fds[1:]:
            _close_fd(extra)
        return n, (fds[0] if fds else None)

    def _read_control(self) -> Frame | None:
        """eBPF mode: a pending GRANT on the registration socket, or None; EOF closes."""
        assert self._control is not None
        try:
            n, fd = self._recv_record(self._control, self._ctl_view)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise EndpointClosed(f"endpoint {self.id}: registration socket failed ({exc})") from exc
        if n == 0:
            raise EndpointClosed(f"endpoint {self.id}: router closed the registration")
        try:
            frame = Frame.decode(self._ctl_view) if n == FRAME_SIZE else None
        except FrameError:
            frame = None
        if frame is None or frame.kind != Kind.GRANT:
            log.warning("endpoint %d: unexpected record from the router discarded", self.id)
            _close_fd(fd)
            return None
        return self._take_grant(frame, fd)

    def _take_grant(self, frame: Frame, fd: int | None) -> Frame:
        old, self._store_fd = self._store_fd, (fd if frame.job else None)
        _close_fd(old)
        if not frame.job:
            _close_fd(fd)
        self.job = frame.job
        log.debug("endpoint %d: granted job %d", self.id, frame.job)
        return frame

    def _router_stopped(self) -> None:
        """Wake a blocked ``recv`` with EOF (the router owning this local endpoint stops)."""
        with contextlib.suppress(OSError):
            self._data.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the sockets; the router removes this endpoint and its metrics."""
        if self._closed:
            return
        self._closed = True
        _close_fd(self._store_fd)
        self._store_fd = None
        for s in (self._data, self._control, *self._keep):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
        if self._on_close is not None:
            self._on_close(self.id)


def connect(socket_path: str, role: str = "aggregator", *, timeout: float = 5.0) -> Endpoint:
    """Register with the node's router and return this process's endpoint, job-agnostic.

    The endpoint starts in no job (``job`` 0): frames reach it only once the router grants
    it a job (:meth:`RouterServer.grant`), which :meth:`Endpoint.recv` reports as a GRANT
    frame. A function never declares its own job.

    Parameters
    ----------
    socket_path : str
        The router's Unix socket (``RouterServer(socket_path)``).
    role : str
        Free-form label shown in ``RouterServer.endpoints()`` (at most 32 bytes).
    timeout : float
        Seconds to wait for each registration step.

    Raises
    ------
    RegistrationRefused
        With the router's reason (peer not allowed, bad hello, ...).
    OSError
        If the router socket cannot be reached.
    """
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        ctl.settimeout(timeout)
        ctl.connect(socket_path)
        # If the router already answered (a refusal), its answer below says why.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            ctl.sendall(encode_hello(0, role))
        mode, endpoint_id = decode_welcome(ctl.recv(MAX_RECORD))
        if mode == MODE_EBPF:
            data, peer = loopback_tcp_pair()
            try:
                send_with_fd(ctl, encode_attach(endpoint_id), data.fileno())
                decode_ready(ctl.recv(MAX_RECORD))
            except BaseException:
                data.close()
                peer.close()
                raise
            ctl.settimeout(None)
            log.debug("registered endpoint %d (ebpf)", endpoint_id)
            return Endpoint(endpoint_id, 0, MODES[mode], data, control=ctl, keep=(peer,))
        ctl.settimeout(None)
        log.debug("registered endpoint %d (userspace)", endpoint_id)
        return Endpoint(endpoint_id, 0, MODES[mode], ctl, control=ctl)
    except TimeoutError as exc:
        ctl.close()
        raise RegistrationRefused(f"router at {socket_path} did not answer in {timeout}s") from exc
    except BaseException:
        ctl.close()
        raise
