"""bench-dataplane's micro-benchmarks: ingest (the gateway's decode-once into the store against a
raw TCP socket and a plain Starlette app receiving the same ResNet-18-sized bodies) and the fold
(:func:`bench_aggregation`), with their client and server processes (``python -m
bench.dataplane_ingest --role client|tcp-server``). Run by :mod:`bench.dataplane`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.fedfaas_round import create_job, start_bench_gateway
from bench.runinfo import (
    PINNED_THREADS,
)

if TYPE_CHECKING:
    from core.services import RedisServer


ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- payloads
def resnet18_update(seed: int) -> dict[str, np.ndarray]:
    """A ResNet-18 (10 classes) state dict with random float32 values (BN counters int64)."""
    from torchvision.models import resnet18

    rng = np.random.default_rng(seed)
    sd = resnet18(weights=None, num_classes=10).state_dict()
    return {
        k: (
            v.numpy()
            if v.dtype.is_floating_point is False
            else rng.standard_normal(tuple(v.shape), dtype=np.float32) * 0.05
        )
        for k, v in sd.items()
    }


def write_bodies(work: Path, n: int) -> list[Path]:
    """``n`` ResNet-18-sized update bodies (safetensors) in ``work``, one file each."""
    from core import wire

    paths = []
    for i in range(n):
        p = work / f"update-{i}.safetensors"
        p.write_bytes(wire.encode_tensors(resnet18_update(1000 + i)))
        paths.append(p)
    return paths


# ----------------------------------------------------------------------------- client role
def _http_post(
    port: int,
    path: str,
    headers: dict[str, str],
    body: bytes,
    tls: ssl.SSLContext | None = None,
) -> tuple[int, int, int]:
    """POST over a raw socket (in a TLS connection when ``tls`` is given, its handshake
    counted); returns (status, t_first_byte_ns, t_response_ns)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t_connect = time.monotonic_ns()
    if tls is not None:
        s = tls.wrap_socket(s, server_hostname="127.0.0.1")
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    t0 = t_connect if tls is not None else time.monotonic_ns()
    s.sendall(head.encode())
    s.sendall(body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    t1 = time.monotonic_ns()
    s.close()
    return int(data.split(b" ")[1]), t0, t1


def _tcp_send(port: int, body: bytes) -> tuple[int, int, int]:
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic_ns()
    s.sendall(body)
    ok = s.recv(1)
    t1 = time.monotonic_ns()
    s.close()
    return (200 if ok == b"K" else 0), t0, t1


def _client_role(a: argparse.Namespace) -> None:
    spec = json.loads(Path(a.spec).read_text())
    out = []
    bodies = {p: Path(p).read_bytes() for p in {u["body"] for u in spec["uploads"]}}
    for u in spec["uploads"]:
        body = bodies[u["body"]]
        mode, port = u.get("mode", spec.get("mode")), u.get("port", spec.get("port"))
        if mode == "tcp":
            out.append(_tcp_send(port, body))
        else:
            out.append(_http_post(port, u["path"], u.get("headers", {}), body))
    Path(a.out).write_text(json.dumps(out))


def _run_clients(work: Path, specs: list[dict[str, Any]]) -> list[list[tuple[int, int, int]]]:
    procs = []
    for i, spec in enumerate(specs):
        sp, op = work / f"client-{i}.json", work / f"client-{i}.out"
        sp.write_text(json.dumps(spec))
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.dataplane_ingest",
                        "--role",
                        "client",
                        "--spec",
                        str(sp),
                        "--out",
                        str(op),
                    ],
                    cwd=ROOT,
                ),
                op,
            )
        )
    results = []
    for p, op in procs:
        if p.wait(600) != 0:
            raise RuntimeError("bench client failed")
        results.append([tuple(x) for x in json.loads(op.read_text())])
    return results


# ----------------------------------------------------------------------------- servers
def _tcp_server_role(a: argparse.Namespace) -> None:
    """Raw loopback TCP: recv_into one pre-faulted, mmap'd /dev/shm buffer, answer one byte."""
    import mmap

    size = int(a.size)
    path = f"/dev/shm/fedfaas-bench-tcp-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, size)
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    os.close(fd)
    os.unlink(path)
    view = memoryview(mm)
    srv = socket.socket()
    srv.bind(("127.0.0.1", int(a.port)))
    srv.listen(16)
    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        got = 0
        while got < size:
            n = c.recv_into(view[got:])
            if not n:
                break
            got += n
        c.sendall(b"K")
        c.close()


STARLETTE_APP = """
import mmap, os
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
SIZE = int(os.environ["BENCH_SIZE"])
buf = bytearray(SIZE)
async def upload(request):
    pos = 0
    async for chunk in request.stream():
        n = len(chunk)
        buf[pos:pos + n] = chunk
        pos += n
    return JSONResponse({"received": pos}, status_code=202)
app = Starlette(routes=[Route("/upload", upload, methods=["POST"])])
"""


def _start(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    base = {**os.environ, **PINNED_THREADS, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env={**base, **(env or {})},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


# ----------------------------------------------------------------------------- parts
def bench_ingest(
    work: Path, rs: RedisServer, body_path: Path, reps: int, *, ebpf: bool
) -> dict[str, Any]:
    """The three servers run side by side; one client alternates between them, so each
    rep of each path sees the same machine load. No aggregator runs: ingest only."""
    from core.services import free_port, wait_for_port

    size = body_path.stat().st_size
    out: dict[str, Any] = {"update_bytes": size, "reps": reps}
    procs: list[subprocess.Popen[bytes]] = []
    # FedFaaS gateway: a job whose clients each upload once; the pool holds every object
    gw = start_bench_gateway(work, rs, "ingest", ebpf=ebpf, pool=reps + 2, max_inflight=0)
    try:
        out["router"] = gw.health()["router"]
        port = gw.settings.port
        clients = [f"i{k}" for k in range(reps)]
        info = create_job(port, gw.secret(), "ingest", clients, reps, body_path.read_bytes())
        tport = free_port()
        procs.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "bench.dataplane_ingest",
                    "--role",
                    "tcp-server",
                    "--port",
                    str(tport),
                    "--size",
                    str(size),
                ]
            )
        )
        (work / "star_app.py").write_text(STARLETTE_APP)
        uport = free_port()
        procs.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "star_app:app",
                    "--port",
                    str(uport),
                    "--log-level",
                    "warning",
                    "--loop",
                    "uvloop",
                    "--http",
                    "httptools",
                ],
                env={"BENCH_SIZE": str(size)},
                cwd=work,
            )
        )
        wait_for_port("127.0.0.1", tport, 30, procs[0])
        wait_for_port("127.0.0.1", uport, 30, procs[1])
        ups: list[dict[str, Any]] = []
        for c in clients:
            ups.append(
                {
                    "mode": "http",
                    "port": port,
                    "body": str(body_path),
                    "path": "/v1/jobs/ingest/rounds/1/updates",
                    "headers": {
                        "Authorization": f"Bearer {info['tokens'][c]}",
                        "X-Client-Id": c,
                        "X-Sample-Count": "10",
                    },
                }
            )
            ups.append({"mode": "tcp", "port": tport, "body": str(body_path)})
            ups.append({"mode": "http", "port": uport, "body": str(body_path), "path": "/upload"})
        res = _run_clients(work, [{"uploads": ups}])[0]
        for i, name in enumerate(("fedfaas", "tcp", "starlette")):
            mine = res[i::3]
            assert all(r[0] in (200, 202) for r in mine), (name, mine)
            out[f"{name}_s"] = [(t1 - t0) / 1e9 for _, t0, t1 in mine]
    finally:
        for p in procs:
            _stop(p)
        gw.stop()
        shutil.rmtree(gw.settings.shm_root, ignore_errors=True)  # a stop keeps the stores
    for k in ("fedfaas", "tcp", "starlette"):
        out[f"{k}_gbps"] = size / float(np.median(out[f"{k}_s"])) / 1e9
        out[f"{k}_best_gbps"] = size / float(np.min(out[f"{k}_s"])) / 1e9
    return out


def bench_aggregation(n_updates: int = 8) -> dict[str, Any]:
    import torch

    from core import fedavg, wire
    from core.objstore import Namespace

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ups = [resnet18_update(2000 + i) for i in range(n_updates)]
    spec = wire.ModelSpec.from_safetensors(wire.encode_tensors(ups[0]))
    weights = [float(10 + i) for i in range(n_updates)]
    ns = Namespace(
        Path(f"/dev/shm/fedfaas-bench-agg-{os.getpid()}"),
        "n",
        "agg",
        spec.object_nbytes,
        pool=n_updates + 1,
    )
    out: dict[str, Any] = {"updates": n_updates, "update_bytes": spec.data_nbytes}
    try:
        keys = []
        for u in ups:
            obj = ns.allocate()
            wire.decode_into(wire.encode_tensors(u), spec, obj.buf)
            obj.close()
            ns.seal(obj.key)
            keys.append(obj.key)
        views = [ns.open(k) for k in keys]
        flats = [wire.flat_view(v.buf, spec) for v in views]
        best: dict[str, float] = {}
        for kernel in ("numpy", "torch"):
            acc_np = np.empty(spec.data_nbytes // 4, np.float32)
            for _ in range(3):
                acc = fedavg.Accumulator(acc_np if kernel == "numpy" else torch.from_numpy(acc_np))
                t = time.perf_counter()
                for f, w in zip(flats, weights, strict=True):
                    acc.add(f, w)
                acc.finalize()
                best[kernel] = min(best.get(kernel, 9e9), time.perf_counter() - t)
        plain = [torch.from_numpy(np.array(f)) for f in flats]
        pa = torch.empty_like(plain[0])
        for _ in range(3):
            t = time.perf_counter()
            torch.mul(plain[0], weights[0], out=pa)
            for p, w in zip(plain[1:], weights[1:], strict=True):
                pa.add_(p, alpha=w)
            pa.div_(sum(weights))
            best["plain_add"] = min(best.get("plain_add", 9e9), time.perf_counter() - t)
        try:
            from flwr.server.strategy.aggregate import aggregate

            nds = [[np.asarray(u[t.name], np.float32) for t in spec.tensors] for u in ups]
            for _ in range(2):
                t = time.perf_counter()
                aggregate(list(zip(nds, [int(w) for w in weights], strict=True)))
                best["flower"] = min(best.get("flower", 9e9), time.perf_counter() - t)
        except ImportError:
            best["flower"] = float("nan")
        del flats, plain
        for view in views:
            view.close()
    finally:
        ns.close()
    total = n_updates * spec.data_nbytes
    for k, v in best.items():
        out[f"{k}_s"] = v
        out[f"{k}_gbps"] = total / v / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dataplane_ingest")
    p.add_argument("--role", required=True, choices=["client", "tcp-server"])
    p.add_argument("--spec", help="client: its spec JSON")
    p.add_argument("--out", help="client: where its marks go")
    p.add_argument("--port", help="tcp-server: the port")
    p.add_argument("--size", help="tcp-server: the body size")
    a = p.parse_args(argv)
    if a.role == "client":
        _client_role(a)
    else:
        _tcp_server_role(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
