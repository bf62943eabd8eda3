"""An HTTP/1.1 relay in front of one gateway, that a test turns against some of its requests.

A gateway reaches its peers at the URLs of its ``peers`` setting: give it this relay's URL for a
peer, and the test decides what happens to each request whose path matches ``pattern``
(default: cross-node partials), as a network between two nodes can:

- :data:`PASS`: relayed, answer and all;
- :data:`HOLD`: kept, unanswered, until the mode changes (a slow or partitioned link);
- :data:`LOSE_ANSWER`: the sender's connection is closed at once, and the request relayed
  to the peer once :attr:`PeerProxy.lost_gate` is set (at once by default): the peer acts on
  it, the sender cannot know;
- :data:`REFUSE`: the connection is closed before anything is relayed (a peer that is down);
- :data:`FORBID`: answered 403 ``client_certificate_required`` without relaying (a peer that
  does not take the sender's credential).

Every other request is relayed unchanged. Each request goes upstream on a connection of its
own; the client side keeps its connection alive as the gateway's client expects. Only loopback.
"""

from __future__ import annotations

import re
import socket
import threading
from collections import deque

from tests.dataplane.loopback import LoopbackListener

PASS, HOLD, LOSE_ANSWER, REFUSE, FORBID = "pass", "hold", "lose_answer", "refuse", "forbid"
_FORBIDDEN_BODY = (
    b'{"error":"client_certificate_required",'
    b'"detail":"this route takes a platform certificate (peer proxy)"}'
)
FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_FORBIDDEN_BODY), _FORBIDDEN_BODY)
)


class PeerProxy(LoopbackListener):
    """The relay (see the module docstring), listening on a free loopback port.

    Parameters
    ----------
    upstream_port
        The gateway's port on 127.0.0.1.
    pattern
        Requests whose path matches it are the ones a mode applies to.
    """

    def __init__(self, upstream_port: int, pattern: str = r"/partials$") -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.pattern = re.compile(pattern)
        self.mode = PASS
        #: modes the next matching requests take, one each, before :attr:`mode`
        self.next_modes: deque[str] = deque()
        #: matching requests seen, held now, and by what happened to them
        self.seen = 0
        self.held = 0
        self.outcomes: dict[str, int] = {}
        #: set: a request whose answer is lost reaches the peer now; clear: when it is set
        self.lost_gate = threading.Event()
        self.lost_gate.set()
        self._cond = threading.Condition()
        self._closed = False
        self.listen("peer-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: str) -> None:
        """Apply ``mode`` to matching requests from now on (held ones go on at once)."""
        with self._cond:
            self.mode = mode
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()

    # -- the relay ---------------------------------------------------------------------------
    def on_connection(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn)
        with conn:
            while True:
                request = reader.message(request=True)
                if request is None:
                    return
                head, path = request
                mode = self._mode_for(path)
                if mode == REFUSE:
                    return
                if mode == LOSE_ANSWER:
                    threading.Thread(target=self._relay_lost, args=(head,), daemon=True).start()
                    return
                answer = FORBIDDEN if mode == FORBID else self._relay(head)
                if answer is None:
                    return
                try:
                    conn.sendall(answer)
                except OSError:
                    return

    def _mode_for(self, path: str) -> str:
        if not self.pattern.search(path):
            return PASS
        with self._cond:
            self.seen += 1
            mode = self.next_modes.popleft() if self.next_modes else self.mode
            if mode == HOLD:
                self.held += 1
                while self.mode == HOLD and not self._closed:
                    self._cond.wait(0.5)
                self.held -= 1
                mode = REFUSE if self._closed else self.mode
            self.outcomes[mode] = self.outcomes.get(mode, 0) + 1
            return mode

    def _relay_lost(self, request: bytes) -> None:
        while not self.lost_gate.wait(0.5):
            if self._closed:
                return
        self._relay(request)

    def _relay(self, request: bytes) -> bytes | None:
        try:
            with socket.create_connection(self.upstream, timeout=120) as up:
                up.sendall(request)
                answer = _Reader(up).message(request=False)
        except OSError:
            return None
        return None if answer is None else answer[0]


class _Reader:
    """Whole HTTP/1.1 messages (head and Content-Length or chunked body) off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except OSError:
            return False
        self.buf += data
        return bool(data)

    def _take(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._fill():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self, end: bytes) -> bytes | None:
        while end not in self.buf:
            if not self._fill():
                return None
        i = self.buf.index(end) + len(end)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def message(self, *, request: bool) -> tuple[bytes, str] | None:
        """``(the whole message, the request's path or the answer's status line)``, or None
        at the end of the stream."""
        head = self._line(b"\r\n\r\n")
        if head is None:
            return None
        first, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        what = first.split(" ")[1] if request else first
        status = 0 if request else int(first.split(" ")[1])
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = self._line(b"\r\n")
                if size_line is None:
                    return None
                size = int(size_line.split(b";")[0], 16)
                chunk = self._take(size + 2)
                if chunk is None:
                    return None
                body += size_line + chunk
                if size == 0:
                    break
        elif status not in (204, 304) and status // 100 != 1:
            n = int(headers.get("content-length", "0"))
            data = self._take(n)
            if data is None:
                return None
            body = data
        return head + body, what.split("?", 1)[0] if request else what
