"""The userspace router backend: the router thread reads each frame and writes it on.

Used where the eBPF sidecar cannot load. Same contract and the same accounting rules as the
kernel program (``bpf.metrics``): frames go only to registered endpoints of the sender's job,
the ``src`` field must be the sender's own id, everything else is dropped and counted.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import time

from bpf.frame import FRAME_SIZE, Kind
from bpf.metrics import Accounting, DropReason, EndpointInfo
from bpf.protocol import MODE_USERSPACE

_HEAD = struct.Struct("<IIH")  # dst, src, kind
_GRANT = int(Kind.GRANT)
_BATCH = 64  # frames read from one connection before the selector looks at the others
MAX_QUEUED = 65536  # frames waiting for one slow receiver before new ones are dropped


class UserspaceBackend:
    """Forwards frames between the router-side ends of SOCK_SEQPACKET connections."""

    mode = "userspace"
    mode_code = MODE_USERSPACE
    wants_fd = False

    def __init__(self, accounting: Accounting) -> None:
        self._acct = accounting
        self._selector: selectors.BaseSelector | None = None
        self._conns: dict[int, socket.socket] = {}
        self._jobs: dict[int, int] = {}
        self._queued: dict[int, collections.deque[bytes]] = {}
        self._buf = bytearray(FRAME_SIZE + 1)  # one spare byte reveals oversized records
        self._view = memoryview(self._buf)

    def bind(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector

    def add(self, info: EndpointInfo, conn: socket.socket) -> None:
        """Start forwarding frames read from ``conn`` (called on the router thread)."""
        assert self._selector is not None
        conn.setblocking(False)
        self._conns[info.id] = conn
        self._jobs[info.id] = info.job
        self._queued[info.id] = collections.deque()
        self._selector.register(
            conn, selectors.EVENT_READ, (info.id, self._readable, self._writable)
        )

    def set_job(self, endpoint_id: int, job: int) -> None:
        """Grant ``job`` to a registered endpoint (called on the router thread)."""
        if endpoint_id in self._jobs:
            self._jobs[endpoint_id] = job

    def remove(self, endpoint_id: int) -> None:
        conn = self._conns.pop(endpoint_id, None)
        self._jobs.pop(endpoint_id, None)
        self._queued.pop(endpoint_id, None)
        if conn is not None and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn)

    def close(self) -> None:
        for endpoint_id in list(self._conns):
            self.remove(endpoint_id)

    def _readable(self, endpoint_id: int) -> bool:
        """Drain up to a batch of frames; False when the connection is gone."""
        conn = self._conns.get(endpoint_id)
        if conn is None:
            return False
        buf, view = self._buf, self._view
        for _ in range(_BATCH):
            try:
                n = conn.recv_into(buf, FRAME_SIZE + 1)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if n == 0:
                return False
            self._forward(endpoint_id, n, buf, view)
        return True

    def _forward(self, sender: int, n: int, buf: bytearray, view: memoryview) -> None:
        acct = self._acct
        if n != FRAME_SIZE:
            acct.dropped(sender, DropReason.BAD_SIZE)
            return
        dst, src, kind = _HEAD.unpack_from(buf)
        if src != sender or kind == _GRANT:  # only the router itself grants
            acct.dropped(sender, DropReason.SPOOFED_SRC)
            return
        job = self._jobs.get(dst)
        if job is None:
            acct.dropped(sender, DropReason.UNKNOWN_DST)
            return
        if job != self._jobs[sender]:
            acct.dropped(sender, DropReason.CROSS_JOB)
            return
        queue = self._queued[dst]
        if len(queue) >= MAX_QUEUED:
            acct.dropped(sender, DropReason.UNDELIVERABLE)
            return
        # Counted when accepted, before the write, as the kernel counts at redirect time: a
        # receiver never sees a frame that its metrics do not show yet.
        acct.delivered(sender, dst, kind, FRAME_SIZE, time.monotonic_ns())
        if queue:
            queue.append(bytes(view[:FRAME_SIZE]))
            return
        try:
            self._conns[dst].send(view[:FRAME_SIZE])
        except BlockingIOError:
            queue.append(bytes(view[:FRAME_SIZE]))
            self._want_write(dst, True)
        except OSError:
            acct.dropped(sender, DropReason.UNDELIVERABLE)

    def _writable(self, endpoint_id: int) -> bool:
        conn = self._conns.get(endpoint_id)
        queue = self._queued.get(endpoint_id)
        if conn is None or queue is None:
            return False
        while queue:
            try:
                conn.send(queue[0])
            except BlockingIOError:
                return True
            except OSError:
                return False
            queue.popleft()
        self._want_write(endpoint_id, False)
        return True

    def _want_write(self, endpoint_id: int, on: bool) -> None:
        assert self._selector is not None
        conn = self._conns[endpoint_id]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        self._selector.modify(conn, events, (endpoint_id, self._readable, self._writable))
