"""The gateway side: :class:`RouterServer` registers endpoints and routes their frames.

One thread runs a selector over the registration socket, every endpoint's registration
connection and (userspace mode only) the frames themselves. In eBPF mode the thread only sees
registrations and disconnects: frames are routed by the kernel (``sidecar.c``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import selectors
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from bpf.endpoint import Endpoint
from bpf.errors import EbpfUnavailable, RegistrationRefused, RouterError
from bpf.frame import Frame, Kind
from bpf.metrics import Accounting, EndpointInfo, EndpointMetrics
from bpf.protocol import (
    MAX_RECORD,
    decode_attach,
    decode_hello,
    encode_ready,
    encode_welcome,
    peer_credentials,
    recv_with_fd,
    send_with_fd,
)
from bpf.userspace import UserspaceBackend

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 2.0
_U32_MAX = 0xFFFF_FFFF


class _Backend(Protocol):
    mode: str
    mode_code: int
    wants_fd: bool

    def bind(self, selector: selectors.BaseSelector) -> None: ...
    def remove(self, endpoint_id: int) -> None: ...
    def close(self) -> None: ...


class RouterServer:
    """Registers endpoints over a Unix socket and routes 64-byte frames between them.

    Parameters
    ----------
    socket_path : str
        Unix socket to listen on (mode 0600; peers checked with SO_PEERCRED).
    prefer_ebpf : bool
        Load the eBPF sidecar when possible; otherwise (or when it cannot load) the router
        thread forwards frames in userspace. ``mode`` and ``reason`` tell which and why.
    on_disconnect : callable, optional
        ``on_disconnect(endpoint_id)``, called on the router thread when an endpoint's
        registration socket closes (process exit, crash or ``Endpoint.close``).
    """

    def __init__(
        self,
        socket_path: str,
        *,
        prefer_ebpf: bool = True,
        on_disconnect: Callable[[int], None] | None = None,
    ) -> None:
        self.socket_path = str(socket_path)
        self.prefer_ebpf = prefer_ebpf
        self.on_disconnect = on_disconnect
        self._allowed_uids = {os.getuid(), 0}
        self._backend: Any = None
        self._mode = ""
        self._reason = "not started"
        self._acct = Accounting()
        self._infos: dict[int, EndpointInfo] = {}
        self._conns: dict[int, socket.socket] = {}
        self._reserved: set[int] = set()
        self._locals: weakref.WeakValueDictionary[int, Endpoint] = weakref.WeakValueDictionary()
        self._lock = threading.RLock()
        self._next_id = 1
        self._selector: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> RouterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def mode(self) -> str:
        """``"ebpf"`` or ``"userspace"`` (set by :meth:`start`)."""
        if not self._mode:
            raise RouterError("router not started")
        return self._mode

    @property
    def reason(self) -> str:
        """Why the router runs in its mode (e.g. why eBPF could not load)."""
        return self._reason

    def start(self) -> RouterServer:
        """Choose the backend, listen, and start the router thread."""
        if self._thread is not None:
            return self
        self._choose_backend()
        self._listen()
        self._selector = selectors.DefaultSelector()
        self._backend.bind(self._selector)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, (0, self._run_calls, None))
        assert self._listener is not None
        self._selector.register(self._listener, selectors.EVENT_READ, (0, self._accept, None))
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="fedfaas-router", daemon=True)
        self._thread.start()
        log.info("router on %s in %s mode: %s", self.socket_path, self._mode, self._reason)
        return self

    def stop(self) -> None:
        """Stop the thread, close every registration and unload the program."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout=5)
        self._thread = None
        with self._lock:
            for endpoint_id in list(self._infos):
                self._forget(endpoint_id)
        for endpoint in list(self._locals.values()):
            endpoint._router_stopped()  # eBPF local endpoints have no registration socket
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        if self._selector is not None:
            self._selector.close()
        self._backend.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        log.info("router on %s stopped", self.socket_path)

    def _choose_backend(self) -> None:
        if self.prefer_ebpf:
            from bpf.ebpf_router import EbpfBackend

            try:
                self._backend = EbpfBackend.create()
                self._mode, self._reason = "ebpf", "eBPF SK_MSG sidecar loaded"
                return
            except EbpfUnavailable as exc:
                self._reason = f"eBPF unavailable: {exc.reason}"
                log.warning("falling back to the userspace router: %s", exc.reason)
        else:
            self._reason = "eBPF not requested (prefer_ebpf=False)"
        self._backend = UserspaceBackend(self._acct)
        self._mode = "userspace"

    def _listen(self) -> None:
        path = self.socket_path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale socket of a dead router
            else:
                raise RouterError(f"another router is listening on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener

    # -- public queries ----------------------------------------------------------------------

    def endpoints(self) -> dict[int, EndpointInfo]:
        """Registered endpoints by id."""
        with self._lock:
            return dict(self._infos)

    def metrics(self) -> dict[int, EndpointMetrics]:
        """Per-endpoint counters (from the kernel map in eBPF mode)."""
        if self._mode == "ebpf":
            return dict(self._backend.metrics())
        with self._lock:
            return self._acct.snapshot()

    def drops(self) -> dict[str, int]:
        """Refused frames by reason (``bad_size``, ``cross_job``, ``unknown_dst``, ...)."""
        if self._mode == "ebpf":
            return dict(self._backend.drops())
        return self._acct.drops()

    def status(self) -> dict[str, Any]:
        """Mode, reason, endpoints, metrics and drops as plain JSON-ready data."""
        from dataclasses import asdict

        metrics = self.metrics()
        return {
            "mode": self._mode,
            "reason": self._reason,
            "endpoints": [
                {**asdict(info), "metrics": asdict(metrics[i]) if i in metrics else None}
                for i, info in sorted(self.endpoints().items())
            ],
            "drops": self.drops(),
        }

    def grant(self, endpoint_id: int, job: int, store_dir: str | None, role: str = "") -> None:
        """Give a registered endpoint its job: the gateway's capability grant.

        Endpoints register job-agnostic (job 0); from this call on the router (the kernel map
        in eBPF mode) delivers the endpoint's frames only within ``job``, and the endpoint
        receives a GRANT frame on its registration socket carrying ``store_dir`` (the job's
        object-store folder) as a directory fd: it never names a job or a folder itself.
        ``job`` 0 revokes. A grant to an endpoint already in another job moves it (reuse).

        Raises
        ------
        RouterError
            If the endpoint is unknown, local, or not reading its registration socket.
        """
        if job and store_dir is None:
            raise ValueError("a grant needs the job's store folder")
        if not 0 <= job <= _U32_MAX:
            raise ValueError(f"job must be a u32, got {job}")
        dirfd = None
        if job:
            dirfd = os.open(store_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # type: ignore[arg-type]
        try:
            self._call(lambda: self._grant(endpoint_id, job, role, dirfd))
        finally:
            if dirfd is not None:
                os.close(dirfd)

    def _grant(self, endpoint_id: int, job: int, role: str, dirfd: int | None) -> None:
        with self._lock:
            info = self._infos.get(endpoint_id)
            conn = self._conns.get(endpoint_id)
        if info is None or conn is None or info.local:
            raise RouterError(f"endpoint {endpoint_id} is not a registered function endpoint")
        self._backend.set_job(endpoint_id, job)
        raw = Frame(dst=endpoint_id, src=0, kind=Kind.GRANT, job=job).encode()
        try:
            if dirfd is None:
                conn.send(raw)
            else:
                send_with_fd(conn, raw, dirfd)
        except OSError as exc:
            self._backend.set_job(endpoint_id, info.job)
            raise RouterError(f"endpoint {endpoint_id} did not take its grant: {exc}") from exc
        with self._lock:
            if endpoint_id in self._infos:
                self._infos[endpoint_id] = dataclasses.replace(
                    info, job=job, role=role or info.role
                )
        log.debug("endpoint %d granted job %d (%s)", endpoint_id, job, role or info.role)

    def local_endpoint(self, job: int, role: str = "gateway") -> Endpoint:
        """An endpoint for the gateway itself in job ``job``, registered like any other."""
        if self._thread is None:
            raise RouterError("router not started")
        info = self._new_info(job, role, os.getpid(), os.getuid(), local=True)
        try:
            if self._mode == "ebpf":
                data, keep = self._backend.local_socket(info)
                with self._lock:
                    self._infos[info.id] = info
                endpoint = Endpoint(
                    info.id, job, self._mode, data, keep=keep, on_close=self._local_closed
                )
                self._locals[info.id] = endpoint
                return endpoint
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._call(lambda: self._admit(info, theirs))
        finally:
            self._reserved.discard(info.id)
        return Endpoint(info.id, job, self._mode, mine, control=mine, on_close=self._local_closed)

    # -- router thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._selector is not None
        while not self._stopping:
            for key, events in self._selector.select(timeout=1.0):
                endpoint_id, on_read, on_write = key.data
                try:
                    if events & selectors.EVENT_READ and not on_read(endpoint_id):
                        self._disconnect(endpoint_id)
                        continue
                    if (
                        on_write is not None
                        and events & selectors.EVENT_WRITE
                        and not on_write(endpoint_id)
                    ):
                        self._disconnect(endpoint_id)
                except Exception:
                    log.exception("router: error handling endpoint %d", endpoint_id)

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the router thread and wait for it."""
        if threading.current_thread() is self._thread:
            fn()
            return
        if self._stopping or self._thread is None:
            raise RouterError("router is stopping")
        done = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed back to the caller below
                error.append(exc)
            finally:
                done.set()

        self._calls.append(run)
        self._wake()
        if not done.wait(timeout=10):
            raise RouterError("router thread did not answer in 10 s")
        if error:
            raise error[0]

    def _run_calls(self, _endpoint_id: int) -> bool:
        assert self._wake_r is not None
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        while self._calls:
            self._calls.popleft()()
        return True

    def _accept(self, _endpoint_id: int) -> bool:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return True
        # The handshake runs beside the router thread: a slow peer must not stall forwarding.
        threading.Thread(target=self._register_or_refuse, args=(conn,), daemon=True).start()
        return True

    def _register_or_refuse(self, conn: socket.socket) -> None:
        try:
            self._register(conn)
        except (RegistrationRefused, RouterError, OSError) as exc:
            log.warning("registration refused: %s", exc)
            conn.close()

    def _register(self, conn: socket.socket) -> None:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        pid, uid, _gid = peer_credentials(conn)
        hello = conn.recv(MAX_RECORD)  # read first, so that a refusal reaches a live peer
        if uid not in self._allowed_uids:
            reason = (
                f"peer uid {uid} (pid {pid}) is neither the router's uid {os.getuid()} nor root"
            )
            conn.sendall(encode_welcome(self._backend.mode_code, 0, reason))
            raise RegistrationRefused(reason)
        try:
            job, role = decode_hello(hello)
            if job != 0:
                raise RegistrationRefused(
                    f"hello names job {job}: endpoints register job-agnostic (0) and the "
                    "gateway grants them a job"
                )
        except RegistrationRefused as exc:
            conn.sendall(encode_welcome(self._backend.mode_code, 0, exc.reason))
            raise
        info = self._new_info(job, role, pid, uid, local=False)
        try:
            self._handshake(conn, info)
        finally:
            self._reserved.discard(info.id)
        log.info("endpoint %d registered: job %d, role %s, pid %d", info.id, job, role, pid)

    def _handshake(self, conn: socket.socket, info: EndpointInfo) -> None:
        # The endpoint is admitted before its last answer, so that it is listed (and routable)
        # as soon as connect() returns.
        if not self._backend.wants_fd:
            self._call(lambda: self._admit(info, conn))
            self._answer(conn, info, encode_welcome(self._backend.mode_code, info.id))
            return
        conn.sendall(encode_welcome(self._backend.mode_code, info.id))
        msg, fd = recv_with_fd(conn)
        try:
            if fd is None or decode_attach(msg) != info.id:
                raise RegistrationRefused("ATTACH must carry the endpoint id and one socket")
            self._backend.add_fd(info, fd)
        except (RegistrationRefused, RouterError) as exc:
            conn.sendall(encode_ready(str(exc)))
            raise RegistrationRefused(str(exc)) from exc
        finally:
            if fd is not None:
                os.close(fd)  # the sockhash holds the socket; the endpoint owns the file
        try:
            self._call(lambda: self._admit(info, conn))
        except RouterError:
            self._backend.remove(info.id)
            raise
        self._answer(conn, info, encode_ready())

    def _answer(self, conn: socket.socket, info: EndpointInfo, payload: bytes) -> None:
        try:
            conn.send(payload)
        except OSError:
            # admitted already: it is listed and may have been granted a job and sent a task,
            # so its going is a disconnect the gateway must hear of (its slots run again)
            self._call(lambda: self._disconnect(info.id))
            raise

    def _admit(self, info: EndpointInfo, conn: socket.socket) -> None:
        assert self._selector is not None
        with self._lock:
            self._infos[info.id] = info
            self._conns[info.id] = conn
            if self._mode == "userspace":
                self._acct.add(info.id)
        if self._mode == "userspace":
            self._backend.add(info, conn)
        else:
            conn.setblocking(False)
            self._selector.register(
                conn, selectors.EVENT_READ, (info.id, self._control_readable, None)
            )

    def _control_readable(self, endpoint_id: int) -> bool:
        conn = self._conns.get(endpoint_id)
        if conn is None:
            return False
        try:
            return bool(conn.recv(MAX_RECORD))  # nothing is expected here but EOF
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _new_info(self, job: int, role: str, pid: int, uid: int, *, local: bool) -> EndpointInfo:
        if not 0 <= job <= _U32_MAX:
            raise RegistrationRefused(f"job must be a u32, got {job}")
        with self._lock:
            endpoint_id = self._next_id
            while endpoint_id in self._infos or endpoint_id in self._reserved:
                endpoint_id = endpoint_id % _U32_MAX + 1
            self._next_id = endpoint_id % _U32_MAX + 1
            self._reserved.add(endpoint_id)  # until admitted or refused
            return EndpointInfo(endpoint_id, job, role, pid, uid, local, time.monotonic_ns())

    def _local_closed(self, endpoint_id: int) -> None:
        if self._thread is not None and not self._stopping:
            self._call(lambda: self._disconnect(endpoint_id))

    def _disconnect(self, endpoint_id: int) -> None:
        with self._lock:
            known = self._forget(endpoint_id)
        if known:
            log.info("endpoint %d disconnected", endpoint_id)
            if self.on_disconnect is not None:
                try:
                    self.on_disconnect(endpoint_id)
                except Exception:
                    log.exception("on_disconnect(%d) failed", endpoint_id)

    def _forget(self, endpoint_id: int) -> bool:
        info = self._infos.pop(endpoint_id, None)
        conn = self._conns.pop(endpoint_id, None)
        if info is None:
            return False
        self._backend.remove(endpoint_id)
        self._acct.remove(endpoint_id)
        if conn is not None:
            if self._mode == "ebpf" and self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(conn)
            conn.close()
        return True
