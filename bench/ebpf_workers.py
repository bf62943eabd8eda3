"""The eBPF benchmark's workers: each a process of its own (gateway, top, leaf, proxy), speaking
JSON lines on stdout to the driver (:mod:`bench.ebpf`), which starts them as
``python -m bench.ebpf_workers WORKER --flag value ...``."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import mmap
import os
import resource
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.runinfo import max_pool_threads

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)

#: the job the gateway worker grants every endpoint
JOB = 1


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- workers (separate processes)


def _w_gateway(a: argparse.Namespace) -> None:
    import bpf

    router = bpf.RouterServer(a.socket, prefer_ebpf=a.mode == "ebpf").start()
    _emit({"mode": router.mode, "reason": router.reason})
    for line in sys.stdin:  # an endpoint id a line: grant it the job; EOF: the driver is done
        endpoint_id = int(line)
        router.grant(endpoint_id, JOB, a.shm)
        _emit({"granted": endpoint_id})
    router.stop()


def _take_grant(ep: Any) -> None:
    """Wait for the gateway's GRANT (endpoints register in no job): the job and its store fd."""
    import bpf

    grant = ep.recv(timeout=30)
    if grant is None or grant.kind is not bpf.Kind.GRANT or ep.job != JOB or ep.store_fd is None:
        raise RuntimeError(f"endpoint {ep.id}: expected a GRANT for job {JOB}, got {grant}")


def _touch_us(view: Any) -> float:
    """Read one float32 from every 4 KiB page of ``view``: the cost of reading the update
    through the receiver's mapping (page faults included when there are any)."""
    t0 = time.perf_counter_ns()
    float(view[::1024].sum())
    return (time.perf_counter_ns() - t0) / 1e3


def _w_top_key(a: argparse.Namespace) -> None:
    import bpf
    from core import wire
    from core.objstore import StoreClient
    from functions.aggregator.worker import _flat  # the aggregator's own view of an object

    ep = bpf.connect(a.socket, "top")
    _emit({"id": ep.id})
    _take_grant(ep)
    assert ep.store_fd is not None
    store = StoreClient.from_dir_fd(ep.store_fd)  # as EndpointWorker._take_grant does
    lat: list[int] = []
    key_lat: list[int] = []
    open_lat: list[int] = []
    touch: dict[str, float] = {}
    cpu0 = 0.0
    last = a.warmup + a.n - 1
    for i in range(a.warmup + a.n):
        if i == a.warmup:
            cpu0 = _cpu()
        frame = ep.recv()
        assert frame is not None
        t_key = time.monotonic_ns()
        # the first steps of EndpointWorker._fold: open, check the header, view
        obj = store.open(frame.key)
        wire.read_header(obj.buf)
        view = _flat(obj)
        t_open = time.monotonic_ns()
        if i >= a.warmup:
            lat.append(t_open - frame.t_ns)
            key_lat.append(t_key - frame.t_ns)
            open_lat.append(t_open - t_key)
        if i in (0, last):
            touch["first_touch_us" if i == 0 else "last_touch_us"] = _touch_us(view)
        del view
        obj.close()
        ep.send(bpf.Frame(dst=frame.src, src=0, kind=bpf.Kind.ACK, job=JOB, key=frame.key))
    _emit(
        {
            "lat_ns": lat,
            "key_ns": key_lat,
            "open_ns": open_lat,
            "cpu_s": _cpu() - cpu0,
            "threads": max_pool_threads(),
            "arena_maps": store.arena_remaps,
            **touch,
        }
    )
    store.close()
    ep.close()


def _w_leaf_key(a: argparse.Namespace) -> None:
    import bpf

    ep = bpf.connect(a.socket, "leaf")
    _emit({"id": ep.id})
    _take_grant(ep)
    frame = bpf.Frame(
        dst=a.dst,
        src=0,
        kind=bpf.Kind.PARTIAL,
        job=JOB,
        key=bytes.fromhex(a.key),
        weight=1.0,
        count=1,
    )
    for _ in range(a.warmup):
        ep.send(frame)
        ep.recv()
    _emit({"ready": True})
    sys.stdin.readline()
    cpu0 = _cpu()
    for _ in range(a.n):
        ep.send(frame)  # t_ns stamped at send
        ep.recv()
    _emit({"cpu_s": _cpu() - cpu0})
    ep.close()


def _w_top_http(a: argparse.Namespace) -> None:
    buf = bytearray(a.size)
    lat: list[int] = []
    state = {"count": 0, "cpu0": 0.0, "cpu1": 0.0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            n, t0 = int(self.headers["Content-Length"]), int(self.headers["X-T0"])
            _read_exactly(self.rfile, memoryview(buf)[:n])
            t1 = time.monotonic_ns()
            state["count"] += 1
            if state["count"] > a.warmup:
                lat.append(t1 - t0)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if state["count"] == a.warmup:
                state["cpu0"] = _cpu()
            state["cpu1"] = _cpu()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    _emit({"port": server.server_address[1]})
    server.handle_request()  # one keep-alive connection carries every update
    server.server_close()
    _emit({"lat_ns": lat, "cpu_s": state["cpu1"] - state["cpu0"], "threads": max_pool_threads()})


def _w_leaf_http(a: argparse.Namespace) -> None:
    fd = os.open(os.path.join(a.shm, a.key), os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    os.close(fd)
    body = memoryview(mm)
    conn = http.client.HTTPConnection("127.0.0.1", a.port)

    def post() -> None:
        hdrs = {"X-T0": str(time.monotonic_ns()), "Content-Length": str(len(body))}
        conn.request("POST", "/update", body=body, headers=hdrs)
        conn.getresponse().read()

    for _ in range(a.warmup):
        post()
    _emit({"ready": True})
    sys.stdin.readline()
    cpu0 = _cpu()
    for _ in range(a.n):
        post()
    _emit({"cpu_s": _cpu() - cpu0})
    conn.close()
    body.release()
    mm.close()


def _w_proxy(a: argparse.Namespace) -> None:
    import redis

    from core.secretfiles import read_credentials

    user = read_credentials(Path(a.redis_credentials_file), "Redis")
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=a.redis_port, username=user.username, password=user.password
    )

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(
            self, code: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def do_POST(self) -> None:  # /put/<key> (update) or /ack
            r = redis.Redis(connection_pool=pool)
            n = int(self.headers.get("Content-Length", "0"))
            if self.path == "/ack":
                r.rpush("acks", b"1")
            else:
                body = bytearray(n)
                _read_exactly(self.rfile, memoryview(body))
                key = self.path.rsplit("/", 1)[1]
                r.set(key, bytes(body))
                r.rpush("updates", f"{key}:{self.headers['X-T0']}")
            self._reply(204)

        def do_GET(self) -> None:  # /next (top) or /ack (leaf): block until there is one
            r = redis.Redis(connection_pool=pool)
            if self.path == "/ack":
                r.blpop(["acks"])
                self._reply(200, b"1")
                return
            _, item = r.blpop(["updates"])
            key, t0 = item.decode().split(":")
            # redis-py's pure-Python parser is ~10x slower
            body = _redis_get_bulk(a.redis_port, (user.username, user.password), key)
            r.delete(key)
            self._reply(200, body, {"X-T0": t0})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    _emit({"port": server.server_address[1]})
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()


def _w_top_sl(a: argparse.Namespace) -> None:
    buf = bytearray(a.size)
    conn = http.client.HTTPConnection("127.0.0.1", a.port)
    _emit({"ready": True})
    lat: list[int] = []
    cpu0 = 0.0
    for i in range(a.warmup + a.n):
        if i == a.warmup:
            cpu0 = _cpu()
        conn.request("GET", "/next")
        resp = conn.getresponse()
        n, t0 = int(resp.headers["Content-Length"]), int(resp.headers["X-T0"])
        _read_exactly(resp, memoryview(buf)[:n])
        t1 = time.monotonic_ns()
        if i >= a.warmup:
            lat.append(t1 - t0)
        conn.request("POST", "/ack", body=b"", headers={"Content-Length": "0"})
        conn.getresponse().read()
    _emit({"lat_ns": lat, "cpu_s": _cpu() - cpu0, "threads": max_pool_threads()})


def _w_leaf_sl(a: argparse.Namespace) -> None:
    fd = os.open(os.path.join(a.shm, a.key), os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    os.close(fd)
    body = memoryview(mm)
    conn = http.client.HTTPConnection("127.0.0.1", a.port)

    def handoff() -> None:
        hdrs = {"X-T0": str(time.monotonic_ns()), "Content-Length": str(len(body))}
        conn.request("POST", f"/put/{a.key}", body=body, headers=hdrs)
        conn.getresponse().read()
        conn.request("GET", "/ack")  # paced by the top's acknowledgement, through the broker
        conn.getresponse().read()

    for _ in range(a.warmup):
        handoff()
    _emit({"ready": True})
    sys.stdin.readline()
    cpu0 = _cpu()
    for _ in range(a.n):
        handoff()
    _emit({"cpu_s": _cpu() - cpu0})
    conn.close()
    body.release()
    mm.close()


def _redis_get_bulk(port: int, login: tuple[str, str], key: str) -> bytearray:
    """GET one large value with a plain RESP exchange (after ``AUTH`` as ``login``), read
    straight into one buffer."""
    import socket

    with socket.create_connection(("127.0.0.1", port)) as sock, sock.makefile("rb") as f:
        auth = [b"AUTH", login[0].encode(), login[1].encode()]
        sock.sendall(b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in auth))
        if f.readline() != b"+OK\r\n":
            raise ConnectionError("redis AUTH refused")
        k = key.encode()
        sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
        head = f.readline()
        if not head.startswith(b"$") or head.startswith(b"$-1"):
            raise ConnectionError(f"redis GET {key}: {head!r}")
        body = bytearray(int(head[1:]))
        _read_exactly(f, memoryview(body))
        f.read(2)  # CRLF
        return body


def _read_exactly(stream: Any, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            raise ConnectionError(f"short body: {got} of {len(view)} bytes")
        got += n


WORKERS = {
    "gateway": _w_gateway,
    "top_key": _w_top_key,
    "leaf_key": _w_leaf_key,
    "top_http": _w_top_http,
    "leaf_http": _w_leaf_http,
    "proxy": _w_proxy,
    "top_sl": _w_top_sl,
    "leaf_sl": _w_leaf_sl,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ebpf_workers")
    p.add_argument("worker", choices=sorted(WORKERS))
    for name in ("socket", "mode", "shm", "key", "redis-credentials-file"):
        p.add_argument(f"--{name}")
    for name in ("n", "warmup", "dst", "size", "port", "redis-port"):
        p.add_argument(f"--{name}", type=int)
    a = p.parse_args(argv)
    WORKERS[a.worker](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
