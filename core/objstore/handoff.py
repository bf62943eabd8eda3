"""Lending a round's objects to another process on the node, read-only, under a lease.

The store's owner (a node gateway) offers the updates of a completed round with
:meth:`HandoffServer.offer`: a *ticket* (128 random bits) that names them, valid for ``ttl``
seconds. Whoever is given the ticket (an FLStore cache function, by the cache engine) connects
to the server's Unix socket, claims the ticket and gets, with the answer, the job's folder as a
read-only directory fd (``SCM_RIGHTS``): it maps the objects in place, as an aggregator does,
and never sees another job's folder. From then on each claimed object holds one lease of the
store (:meth:`~core.objstore.store.Namespace.retain`) until the claimer releases it, or its
connection closes (the process died): the owner never recycles an object a claimer still maps.
An offer nobody claims is dropped when its ticket expires.

Whoever was given the ticket may also end the offer early (:func:`end_offer`: the cache
engine does so once the round's placement has claimed what it keeps, so the updates nobody
claimed leave the store at once instead of at the ticket's expiry); what was claimed stays.

Protocol: ``AF_UNIX`` stream socket in the node's store folder (private to the store's user; the
server also checks the peer's uid, ``SO_PEERCRED``). Each message is a 4-byte little-endian
length and a JSON object; requests ``{"op": "claim", "ticket"}``,
``{"op": "release", "ticket", "clients": [...]}`` and ``{"op": "end", "ticket"}``; answers
``{"ok": true, ...}`` or ``{"ok": false, "error", "detail"}``. A claim's answer carries ``job``, ``round``, ``numel``
(floats of the model), ``spec_hash`` and ``objects`` (client -> key), and the directory fd.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.objstore.client import StoreClient, key_hex
from core.objstore.errors import ObjectNotFound, StoreError
from core.objstore.store import Namespace

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
#: the largest message either side accepts (a claim's answer names every object of a round)
MAX_MESSAGE = 8 << 20
_TICKET_HEX = 32


class HandoffError(StoreError):
    """A claim or release the server refused, or a connection that broke."""


def _send(sock: socket.socket, obj: dict[str, Any], fd: int | None = None) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    frame = _LEN.pack(len(data)) + data
    if fd is None:
        sock.sendall(frame)
        return
    sent = socket.send_fds(sock, [frame], [fd])  # the fd rides on the first bytes
    if sent < len(frame):
        sock.sendall(frame[sent:])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise HandoffError("the handoff connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, *, with_fd: bool = False) -> tuple[dict[str, Any], list[int]]:
    if with_fd:
        head, fds, _, _ = socket.recv_fds(sock, _LEN.size, 1)
        if not head:
            raise HandoffError("the handoff connection closed")
        if len(head) < _LEN.size:
            head += _recv_exact(sock, _LEN.size - len(head))
    else:
        head, fds = _recv_exact(sock, _LEN.size), []
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE:
        for fd in fds:
            os.close(fd)
        raise HandoffError(f"a handoff message of {n} bytes (at most {MAX_MESSAGE})")
    try:
        obj = json.loads(_recv_exact(sock, n))
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        for fd in fds:
            os.close(fd)
        raise HandoffError("a handoff message that is not a JSON object")
    return obj, list(fds)


@dataclass
class _Offer:
    ns: Namespace
    job: str
    round: int
    numel: int
    spec_hash: str
    objects: dict[str, str]  # client -> key hex; each holds one lease until the offer ends
    expires: float


@dataclass
class _Peer:
    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    #: ticket -> clients this connection claimed (one lease each)
    claims: dict[str, set[str]] = field(default_factory=dict)


class HandoffServer:
    """The owner's side (see the module): offers, claims, releases, on one thread.

    Parameters
    ----------
    path
        The socket's path (its folder must be private to this user; an old socket there is
        replaced).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._offers: dict[str, _Offer] = {}
        #: offers past their ticket's life that a connection still holds claims of
        self._ended: dict[str, _Offer] = {}
        self._peers: dict[int, _Peer] = {}
        self.stats = {
            "offered": 0,
            "claimed": 0,
            "released": 0,
            "expired": 0,
            "ended": 0,
            "refused": 0,
        }
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(64)
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="handoff", daemon=True)
        self._thread.start()

    # -- the owner's calls ------------------------------------------------------------------
    def offer(
        self,
        ns: Namespace,
        job: str,
        rnd: int,
        numel: int,
        spec_hash: str,
        objects: Mapping[str, bytes | str],
        ttl: float,
    ) -> str:
        """Offer ``objects`` (client -> key) of ``ns``; returns the ticket. Each object must
        hold one lease taken for this offer: the offer owns it from now on. The job's earlier
        offers end now (what was claimed of them stays with its claimers): a cache wants the
        newest round, and a node must not keep a round per ``ttl`` of fast rounds."""
        ticket = secrets.token_hex(_TICKET_HEX // 2)
        o = _Offer(
            ns,
            job,
            rnd,
            numel,
            spec_hash,
            {c: key_hex(k) for c, k in objects.items()},
            time.monotonic() + ttl,
        )
        with self._lock:
            for t in [t for t, x in self._offers.items() if x.ns is ns and x.job == job]:
                self._end_offer(t)
            self._offers[ticket] = o
            self.stats["offered"] += 1
        os.write(self._wake_w, b"x")  # its expiry may be the next deadline
        return ticket

    def withdraw(self, ns: Namespace) -> None:
        """``ns`` is about to close (its job forgotten, the gateway stopping): end its offers
        and close every connection that claimed from it, so claimers drop those objects
        before the pages go."""
        with self._lock:
            for t in [t for t, o in self._offers.items() if o.ns is ns]:
                self._end_offer(t)
            mine = {t for t, o in self._ended.items() if o.ns is ns}
            for fd in [fd for fd, p in self._peers.items() if mine & set(p.claims)]:
                self._drop(fd)

    def leases(self) -> int:
        """Leases held for offers and claims (for tests and ``/metrics``)."""
        with self._lock:
            return sum(len(o.objects) for o in self._offers.values()) + sum(
                len(c) for p in self._peers.values() for c in p.claims.values()
            )

    def close(self) -> None:
        """Stop serving and give back every lease (claimers lose their objects' guarantee:
        their connection closes, which is their signal to drop them). Idempotent."""
        if self._stop:
            return
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        with self._lock:
            for ticket in list(self._offers):
                self._end_offer(ticket)
            for fd in list(self._peers):
                self._drop(fd)
        self._sel.close()
        self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -- the thread -------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop:
            with self._lock:
                now = time.monotonic()
                for t in [t for t, o in self._offers.items() if o.expires <= now]:
                    self.stats["expired"] += 1
                    self._end_offer(t)
                nxt = min((o.expires for o in self._offers.values()), default=now + 60)
            for key, _ in self._sel.select(max(0.0, min(60.0, nxt - now)) + 0.01):
                if key.fileobj is self._sock:
                    self._accept()
                elif key.fileobj == self._wake_r:
                    os.read(self._wake_r, 4096)
                else:
                    self._readable(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            log.warning("handoff: refused a peer of uid %d", uid)
            conn.close()
            return
        conn.setblocking(False)
        with self._lock:
            self._peers[conn.fileno()] = _Peer(conn)
        self._sel.register(conn, selectors.EVENT_READ, None)

    def _readable(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        peer = self._peers.get(fd)
        if peer is None:
            return
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            with self._lock:
                self._drop(fd)
            return
        peer.inbox += data
        while len(peer.inbox) >= _LEN.size:
            (n,) = _LEN.unpack_from(peer.inbox)
            if n > MAX_MESSAGE:
                with self._lock:
                    self._drop(fd)
                return
            if len(peer.inbox) < _LEN.size + n:
                return
            raw = bytes(peer.inbox[_LEN.size : _LEN.size + n])
            del peer.inbox[: _LEN.size + n]
            try:
                msg = json.loads(raw)
            except ValueError:
                msg = None
            conn.setblocking(True)  # answers are small and the peer is reading
            try:
                self._answer(peer, msg)
            except OSError:
                with self._lock:
                    self._drop(fd)
                return
            finally:
                with contextlib.suppress(OSError):
                    conn.setblocking(False)

    def _answer(self, peer: _Peer, msg: Any) -> None:
        if not isinstance(msg, dict) or msg.get("op") not in ("claim", "release", "end"):
            _send(peer.sock, _refusal("bad_request", "op must be 'claim', 'release' or 'end'"))
            return
        ticket = msg.get("ticket")
        if not isinstance(ticket, str) or len(ticket) != _TICKET_HEX:
            _send(peer.sock, _refusal("bad_request", "ticket must be 32 hex characters"))
            return
        if msg["op"] == "end":
            with self._lock:
                ended = ticket in self._offers
                if ended:
                    self._end_offer(ticket)
                    self.stats["ended"] += 1
            _send(peer.sock, {"ok": True, "ended": ended})
            return
        if msg["op"] == "release":
            clients = msg.get("clients")
            if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
                _send(peer.sock, _refusal("bad_request", "clients must be a list of strings"))
                return
            with self._lock:
                n = self._release(peer, ticket, clients)
            _send(peer.sock, {"ok": True, "released": n})
            return
        with self._lock:
            o = self._offers.get(ticket)
            if o is None:
                self.stats["refused"] += 1
                answer = _refusal(
                    "unknown_ticket",
                    "no offer has this ticket: it expired, or the gateway restarted since",
                )
                fd = None
            else:
                mine = peer.claims.setdefault(ticket, set())
                for c, k in o.objects.items():
                    if c not in mine:
                        o.ns.retain(k)
                        mine.add(c)
                self.stats["claimed"] += 1
                answer = {
                    "ok": True,
                    "job": o.job,
                    "round": o.round,
                    "numel": o.numel,
                    "spec_hash": o.spec_hash,
                    "objects": o.objects,
                }
                fd = os.open(o.ns.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _send(peer.sock, answer, fd)
        finally:
            if fd is not None:
                os.close(fd)

    # -- under the lock ---------------------------------------------------------------------
    def _release(self, peer: _Peer, ticket: str, clients: list[str]) -> int:
        mine = peer.claims.get(ticket)
        o = self._offers.get(ticket) or self._ended.get(ticket)
        if not mine or o is None:
            return 0
        n = 0
        for c in clients:
            if c in mine:
                mine.discard(c)
                self._give_back(o, o.objects[c])
                n += 1
        if not mine:
            del peer.claims[ticket]
        self.stats["released"] += n
        return n

    def _end_offer(self, ticket: str) -> None:
        o = self._offers.pop(ticket)
        for k in o.objects.values():
            self._give_back(o, k)
        if any(ticket in p.claims for p in self._peers.values()):
            self._ended[ticket] = o  # its claims still name the objects
        else:
            self._ended.pop(ticket, None)

    def _drop(self, fd: int) -> None:
        peer = self._peers.pop(fd, None)
        if peer is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(peer.sock)
        for ticket, clients in list(peer.claims.items()):
            self._release(peer, ticket, list(clients))
        peer.sock.close()
        live = {t for p in self._peers.values() for t in p.claims}
        for t in [t for t in self._ended if t not in live]:
            del self._ended[t]

    @staticmethod
    def _give_back(o: _Offer, key: str) -> None:
        try:
            o.ns.release(key)
        except ObjectNotFound:
            log.warning(
                "handoff: object %s of %s round %d was freed under a lease", key, o.job, o.round
            )


def end_offer(path: str | Path, ticket: str, timeout: float = 5.0) -> bool:
    """End the offer ``ticket`` of the gateway at ``path`` now (what was claimed of it stays
    claimed); True when it was still open. Raises :class:`HandoffError` when the socket
    cannot be reached (another node) or the server refuses."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        _send(sock, {"op": "end", "ticket": ticket})
        msg, _ = _recv(sock)
    except OSError as exc:
        raise HandoffError(f"cannot reach the handoff socket {path}: {exc}") from exc
    finally:
        sock.close()
    if not msg.get("ok"):
        raise HandoffError(f"{msg.get('error')}: {msg.get('detail')}")
    return bool(msg.get("ended"))


def _refusal(code: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "detail": detail}


@dataclass
class Claim:
    """What a claimer got: the round's objects, mapped through :attr:`store` (read-only)."""

    ticket: str
    job: str
    round: int
    numel: int
    spec_hash: str
    objects: dict[str, str]
    store: StoreClient
    dir_fd: int
    #: clients whose objects this claim still holds a lease on (all, until released)
    held: set[str] = field(default_factory=set)


class HandoffClient:
    """The claimer's side: one connection to one node's :class:`HandoffServer`.

    ``on_lost`` is called (from a watcher thread) once the connection closes: the server is
    gone, its leases with it, and the objects claimed through this client must be dropped
    before the owner can reuse their memory.
    """

    def __init__(self, path: str | Path, on_lost: Callable[[HandoffClient], None]) -> None:
        self.path = Path(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(self.path))
        except OSError as exc:
            self._sock.close()
            raise HandoffError(f"cannot reach the handoff socket {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self.claims: dict[str, Claim] = {}
        self.lost = threading.Event()
        self._closing = False
        self._on_lost = on_lost
        self._watch = threading.Thread(target=self._watcher, name="handoff-watch", daemon=True)
        self._watch.start()

    def claim(self, ticket: str) -> Claim:
        """Claim ``ticket`` (again: the same :class:`Claim`)."""
        with self._lock:
            if ticket in self.claims and not self.lost.is_set():
                return self.claims[ticket]
            msg, fds = self._call({"op": "claim", "ticket": ticket}, with_fd=True)
            if not fds:
                raise HandoffError("the handoff server sent a claim without its folder")
            for extra in fds[1:]:
                os.close(extra)
            try:
                store = StoreClient.from_dir_fd(fds[0], read_only=True)
            except StoreError:
                os.close(fds[0])
                raise
            c = Claim(
                ticket,
                str(msg["job"]),
                int(msg["round"]),
                int(msg["numel"]),
                str(msg["spec_hash"]),
                {str(k): str(v) for k, v in dict(msg["objects"]).items()},
                store,
                fds[0],
            )
            c.held = set(c.objects)
            self.claims[ticket] = c
            return c

    def release(self, ticket: str, clients: list[str]) -> int:
        """Give back the leases of ``clients`` of a claim; returns how many the server held."""
        with self._lock:
            c = self.claims.get(ticket)
            if c is not None:
                c.held.difference_update(clients)
            msg, _ = self._call({"op": "release", "ticket": ticket, "clients": clients})
            return int(msg.get("released", 0))

    def close(self) -> None:
        """Close the connection: the server gives back every lease of this client."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._watch.join(5)
        self._sock.close()
        self._free_claims()

    def _free_claims(self) -> None:
        """Close every claim's folder and arena (a mapping a view still uses stays until the
        view goes)."""
        with self._lock:
            claims, self.claims = list(self.claims.values()), {}
        for c in claims:
            c.store.close()
            with contextlib.suppress(OSError):
                os.close(c.dir_fd)

    def _call(
        self, req: dict[str, Any], *, with_fd: bool = False
    ) -> tuple[dict[str, Any], list[int]]:
        if self.lost.is_set():
            raise HandoffError(f"the handoff connection to {self.path} is closed")
        try:
            _send(self._sock, req)
            msg, fds = _recv(self._sock, with_fd=with_fd)
        except OSError as exc:
            raise HandoffError(f"handoff connection to {self.path} broke: {exc}") from exc
        if not msg.get("ok"):
            for fd in fds:
                os.close(fd)
            raise HandoffError(f"{msg.get('error')}: {msg.get('detail')}")
        return msg, fds

    def _watcher(self) -> None:
        """Wait for the peer to hang up (without reading: the answers are the callers')."""
        p = select.poll()
        p.register(self._sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        while True:
            try:
                events = p.poll()
            except InterruptedError:
                continue
            except (OSError, ValueError):
                break
            if any(
                ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
                for _, ev in events
            ):
                break
        self.lost.set()
        if self._closing:
            return
        try:
            self._on_lost(self)  # the claimer drops what it mapped first
        except Exception:
            log.exception("handoff: on_lost of %s failed", self.path)
        self._free_claims()
