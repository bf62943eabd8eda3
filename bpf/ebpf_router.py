"""The eBPF router backend: the kernel routes frames; the router only manages the maps."""

from __future__ import annotations

import os
import selectors
import socket
import threading

from bpf.errors import RouterError
from bpf.loader import SidecarProgram
from bpf.metrics import EndpointInfo, EndpointMetrics
from bpf.protocol import MODE_EBPF


class EbpfBackend:
    """Endpoints' data sockets live in the kernel's SOCKHASH; no frame passes through here."""

    mode = "ebpf"
    mode_code = MODE_EBPF
    wants_fd = True

    def __init__(self, program: SidecarProgram) -> None:
        from bpf.protocol import loopback_tcp_pair

        self._prog = program
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # endpoint id -> our copy of its data socket
        self._sink, self._sink_peer = loopback_tcp_pair()
        self._sink.setblocking(False)
        program.set_sink(self._sink.fileno())

    @classmethod
    def create(cls) -> EbpfBackend:
        """Load the program (raises ``EbpfUnavailable`` with the reason)."""
        return cls(SidecarProgram.load())

    def bind(self, selector: selectors.BaseSelector) -> None:
        """Watch the sink: refused frames land there and are discarded (accepted ones never)."""
        selector.register(self._sink, selectors.EVENT_READ, (0, self._drain_sink, None))

    def _drain_sink(self, _endpoint_id: int) -> bool:
        for _ in range(64):
            try:
                if not self._sink.recv(65536):
                    break
            except (BlockingIOError, InterruptedError):
                break
        return True

    def add_fd(self, info: EndpointInfo, fd: int) -> None:
        """Insert an endpoint's data socket; a copy of ``fd`` is kept until :meth:`remove`
        (a grant rewrites the socket's storage, which is keyed by an fd)."""
        with self._lock:
            self._prog.add_endpoint(info.id, info.job, fd)
            self._fds[info.id] = os.dup(fd)

    def set_job(self, endpoint_id: int, job: int) -> None:
        """Grant ``job`` to a registered endpoint: the kernel delivers its frames in that job."""
        with self._lock:
            fd = self._fds.get(endpoint_id)
            if fd is None:
                raise RouterError(f"endpoint {endpoint_id} has no data socket here")
            self._prog.set_job(endpoint_id, job, fd)

    def local_socket(self, info: EndpointInfo) -> tuple[socket.socket, tuple[socket.socket, ...]]:
        """A data socket for an in-process endpoint, already in the map, and what to keep open."""
        from bpf.protocol import loopback_tcp_pair

        data, peer = loopback_tcp_pair()
        try:
            self.add_fd(info, data.fileno())
        except BaseException:
            data.close()
            peer.close()
            raise
        return data, (peer,)

    def remove(self, endpoint_id: int) -> None:
        with self._lock:
            self._prog.remove_endpoint(endpoint_id)
            fd = self._fds.pop(endpoint_id, None)
        if fd is not None:
            os.close(fd)

    def metrics(self) -> dict[int, EndpointMetrics]:
        with self._lock:
            return self._prog.metrics()

    def drops(self) -> dict[str, int]:
        with self._lock:
            return self._prog.drops()

    def close(self) -> None:
        with self._lock:
            self._prog.close()
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)
        self._sink.close()
        self._sink_peer.close()
