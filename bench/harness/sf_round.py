"""The SF round: serverful aggregators that pass whole objects to each other over HTTP.

LIFL's serverful baseline (DESIGN.md, "key handoff ... HTTP copy of the update (SF)"), built as
a peer of the FedFaaS round in ``bench.dataplane`` and measured the same way
(:mod:`bench.harness.round_window`):

- **clients** (``--role client``, one process each, released at once by a ``go`` file) hold the
  weights as numpy arrays (:func:`~bench.harness.round_window.map_weights`), mark
  ``t_start_ns``, serialise them to safetensors (``safetensors.numpy.save``, as the FedFaaS
  clients do), mark ``t_encoded_ns`` and POST the bytes with a bearer token and their sample
  count to their *leaf*;
- **leaf servers** (``--role leaf``, long-running uvicorn+Starlette processes) each host some
  of the leaves (client ``k`` goes to leaf ``k // fanout``, leaf ``l`` lives on server
  ``l % leaf_servers``, :func:`plan_leaves`). A leaf receives the whole body into a buffer,
  decodes it into one flat float32 vector (``core.wire.decode_into``, the layout FedFaaS
  aggregates over) and folds it with FedFaaS's kernel (``core.fedavg.Accumulator``, weight =
  sample count). At its goal it POSTs its partial (the raw float32 sum, its weight and count)
  to the top;
- the **top server** (``--role top``) merges the partials, divides once (``finalize``), encodes
  the global model to safetensors (``core.wire.encode``, as the FedFaaS gateway publishes
  it), marks ``published_ns`` and serves it on ``GET /v1/model``: "available" means servable.

Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>``; the tokens are read
from 0600 files (clients -> leaves one token, leaves and the harness -> top another), and no
body is read before the request is authenticated. Bad input gets a 4xx with a JSON body
``{"error", "detail"}``.

:func:`run_sf_round` runs one round and returns a record with the FedFaaS round's keys:
``e2e_s`` (first client's weights-in-memory mark -> global available), ``server_s`` (first
update bytes received on a leaf server's port, :class:`~bench.harness.round_window.FirstBytes`
on each leaf port, the earliest -> the same end), ``server_peak_bytes`` (the peak of the leaf
servers' and the top's memory, :class:`~bench.harness.round_window.PeakMemory`),
``server_hwm_bytes`` (their summed ``VmHWM``, reset as the window opens); failures as
:func:`~bench.harness.round_window.point_failure` records.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import round_window as rw
from bench.harness.cgroups import born_in
from bench.runinfo import PINNED_THREADS, ROOT

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups


# ----------------------------------------------------------------------------- the tree (pure)
@dataclass(frozen=True)
class Leaf:
    """One leaf aggregator: its id, the leaf server hosting it and the clients it folds."""

    id: int
    server: int
    clients: tuple[int, ...]


def plan_leaves(clients: int, fanout: int, servers: int) -> list[Leaf]:
    """Client ``k`` -> leaf ``k // fanout``; leaf ``l`` -> server ``l % servers``."""
    if clients < 1 or fanout < 1 or servers < 1:
        raise ValueError(f"need clients, fanout, servers >= 1: {clients}, {fanout}, {servers}")
    n = math.ceil(clients / fanout)
    return [
        Leaf(lid, lid % servers, tuple(range(lid * fanout, min(clients, (lid + 1) * fanout))))
        for lid in range(n)
    ]


def warm_kernel() -> None:
    """Load the fold's kernels (numpy, scipy's BLAS) now: a long-running aggregator has them
    loaded before a round starts, so the first update's fold does not import them."""
    import numpy as np

    from core import fedavg

    acc = fedavg.Accumulator(np.zeros(16, np.float32))
    acc.add(np.ones(16, np.float32), 1.0)
    acc.add(np.ones(16, np.float32), 1.0)
    acc.finalize()


def model_spec(layout: Sequence[tuple[str, Sequence[int]]]) -> Any:
    """The ``core.wire.ModelSpec`` of a float32 layout."""
    from core import wire

    return wire.ModelSpec.build([(n, "F32", tuple(int(d) for d in s)) for n, s in layout])


# ----------------------------------------------------------------------------- HTTP helpers
def _error(status: int, error: str, detail: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _authorised(request: Any, token: str) -> bool:
    got = request.headers.get("authorization", "").encode()
    return hmac.compare_digest(got, f"Bearer {token}".encode())


def _unauthorised() -> Any:
    return _error(401, "unauthorized", "send 'Authorization: Bearer <token>'")


def _number(request: Any, header: str, kind: type, low: float) -> Any:
    """Header ``header`` as ``kind`` (finite, >= ``low``), or a 400 response."""
    raw = request.headers.get(header)
    try:
        v = kind(raw)
        if math.isfinite(v) and v >= low:
            return v
    except (TypeError, ValueError):
        pass
    return _error(400, "bad_header", f"{header} must be a {kind.__name__} >= {low}, got {raw!r}")


async def _read_body(request: Any, limit: int, exact: int | None = None) -> Any:
    """The whole body in one buffer of its ``Content-Length``, or a 4xx response."""
    raw = request.headers.get("content-length")
    if raw is None or not raw.isdigit():
        return _error(411, "length_required", "send Content-Length")
    n = int(raw)
    if n > limit or (exact is not None and n != exact):
        want = f"exactly {exact}" if exact is not None else f"at most {limit}"
        return _error(413 if n > limit else 400, "bad_length", f"{n} bytes, want {want}")
    buf, pos = bytearray(n), 0
    async for chunk in request.stream():
        if pos + len(chunk) > n:
            return _error(400, "bad_length", "body longer than Content-Length")
        buf[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    if pos != n:
        return _error(400, "truncated", f"{pos} of {n} bytes")
    return buf


def _health(_request: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"ok": True})


# ----------------------------------------------------------------------------- leaf server
class LeafServer:
    """The leaves of one leaf server: a ``fedavg.Accumulator`` each, created at the first
    update; one decode buffer and one lock per server (decode and fold one update at a time)."""

    def __init__(self, spec: Any, leaves: list[Leaf], top_url: str, top_token: str) -> None:
        import httpx

        self.spec, self.top_url, self.top_token = spec, top_url, top_token
        self.goals = {leaf.id: len(leaf.clients) for leaf in leaves}
        self.accs: dict[int, Any] = {}
        self.done: set[int] = set()
        self.scratch = bytearray(spec.object_nbytes)
        self.lock = asyncio.Lock()
        self.http = httpx.AsyncClient(timeout=600)  # one pool for every hand-off
        warm_kernel()

    def fold(self, leaf: int, body: bytearray, samples: int) -> Any:
        """Decode ``body`` and fold it into ``leaf``; its accumulator once it reached its goal."""
        import numpy as np

        from core import fedavg, wire

        wire.decode_into(body, self.spec, memoryview(self.scratch))
        acc = self.accs.get(leaf)
        if acc is None:
            acc = self.accs[leaf] = fedavg.Accumulator(np.empty(self.spec.data_nbytes // 4, "f4"))
        acc.add(wire.flat_view(self.scratch, self.spec), samples)
        return self.accs.pop(leaf) if acc.count == self.goals[leaf] else None

    async def hand_off(self, leaf: int, acc: Any) -> str | None:
        """POST the leaf's partial (raw float32 sum, weight, count) to the top; None when the
        top took it, else what went wrong."""
        import httpx

        headers = {
            "Authorization": f"Bearer {self.top_token}",
            "X-Leaf": str(leaf),
            "X-Weight": repr(acc.weight),
            "X-Count": str(acc.count),
        }
        try:
            r = await self.http.post(
                f"{self.top_url}/v1/partials", content=acc.acc.tobytes(), headers=headers
            )
        except httpx.HTTPError as e:
            return f"the top could not be reached: {e!r}"
        return None if r.status_code < 300 else f"the top answered {r.status_code}: {r.text}"

    def app(self, client_token: str) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        from core import wire

        async def update(request: Any) -> Any:
            """Fold one client update into its leaf."""
            if not _authorised(request, client_token):
                return _unauthorised()
            leaf = int(request.path_params["leaf"])
            if leaf not in self.goals:
                return _error(404, "unknown_leaf", f"leaf {leaf} is not on this server")
            samples = _number(request, "X-Sample-Count", int, 1)
            if not isinstance(samples, int):
                return samples
            body = await _read_body(request, self.spec.max_upload_bytes())
            if not isinstance(body, bytearray):
                return body
            async with self.lock:
                if leaf in self.done:
                    return _error(409, "leaf_full", f"leaf {leaf} already has its updates")
                try:
                    acc = await asyncio.to_thread(self.fold, leaf, body, samples)
                except wire.WireError as e:
                    return _error(400, "malformed_update", str(e))
                if acc is not None:
                    self.done.add(leaf)
            del body
            if acc is not None and (why := await self.hand_off(leaf, acc)) is not None:
                return _error(502, "hand_off_failed", why)
            return JSONResponse({"leaf": leaf, "handed_off": acc is not None}, status_code=202)

        return Starlette(
            routes=[
                Route("/healthz", _health),
                Route("/v1/leaves/{leaf:int}/updates", update, methods=["POST"]),
            ]
        )


# ----------------------------------------------------------------------------- top server
class TopServer:
    """Merges the leaves' partials; at ``clients`` updates divides once, encodes, publishes."""

    def __init__(self, spec: Any, leaves: int, clients: int) -> None:
        import numpy as np

        from core import fedavg

        self.spec, self.leaves, self.clients = spec, leaves, clients
        self.acc = fedavg.Accumulator(np.empty(spec.data_nbytes // 4, np.float32))
        self.seen: set[int] = set()
        self.model: bytes | None = None
        self.published_ns = 0
        self.lock = asyncio.Lock()
        warm_kernel()

    def merge(self, body: bytearray, weight: float, count: int) -> None:
        """Merge one partial; publish the global model once every client's update is in."""
        import numpy as np

        from core import wire

        self.acc.merge(np.frombuffer(body, np.float32), weight, count)
        if self.acc.count < self.clients:
            return
        buf = bytearray(self.spec.object_nbytes)
        wire.write_header(
            buf,
            self.spec,
            kind=wire.KIND_GLOBAL,
            weight=self.acc.weight,
            count=self.acc.count,
            round=1,
        )
        self.acc.finalize(out=wire.flat_view(buf, self.spec))
        self.model = wire.encode(buf, self.spec, {"round": "1"})
        self.published_ns = time.monotonic_ns()

    def app(self, token: str) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        async def partial(request: Any) -> Any:
            """Merge one leaf's partial (headers X-Leaf, X-Weight, X-Count; raw float32 body)."""
            if not _authorised(request, token):
                return _unauthorised()
            leaf = _number(request, "X-Leaf", int, 0)
            weight = _number(request, "X-Weight", float, 1e-30)
            count = _number(request, "X-Count", int, 1)
            for v in (leaf, weight, count):
                if not isinstance(v, int | float):
                    return v
            if leaf >= self.leaves or leaf in self.seen:
                return _error(409, "bad_leaf", f"leaf {leaf}: unknown or already merged")
            n = self.spec.data_nbytes
            body = await _read_body(request, n, exact=n)
            if not isinstance(body, bytearray):
                return body
            async with self.lock:
                if leaf in self.seen or self.acc.count + count > self.clients:
                    return _error(409, "bad_leaf", f"leaf {leaf}: already merged or too many")
                self.seen.add(leaf)
                await asyncio.to_thread(self.merge, body, weight, count)
            return JSONResponse({"count": self.acc.count}, status_code=202)

        async def status(request: Any) -> Any:
            """Where the round stands: updates merged, weight, published mark."""
            if not _authorised(request, token):
                return _unauthorised()
            return JSONResponse(
                {
                    "count": self.acc.count,
                    "weight": self.acc.weight,
                    "leaves_merged": len(self.seen),
                    "published_ns": self.published_ns,
                }
            )

        async def model(request: Any) -> Any:
            """The global model as safetensors, once published."""
            if not _authorised(request, token):
                return _unauthorised()
            if self.model is None:
                return _error(409, "not_available", f"{self.acc.count}/{self.clients} updates")
            return Response(self.model, media_type="application/octet-stream")

        return Starlette(
            routes=[
                Route("/healthz", _health),
                Route("/v1/partials", partial, methods=["POST"]),
                Route("/v1/status", status),
                Route("/v1/model", model),
            ]
        )


# ----------------------------------------------------------------------------- roles
def read_token(path: str | Path) -> str:
    """A token from its file, which must be private to its owner (mode 0600 or tighter)."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path}: mode {mode:o}, want 0600")
    return Path(path).read_text().strip()


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools"
    )


def _client_main(spec_path: Path, out: Path) -> None:
    """One client: :func:`~bench.harness.round_window.client_round`, POSTing to its leaf."""
    import httpx

    spec = json.loads(spec_path.read_text())
    headers = {"Authorization": f"Bearer {spec['token']}", "X-Sample-Count": str(spec["samples"])}
    with httpx.Client(timeout=600) as c:

        def send(data: bytes) -> None:
            c.post(spec["url"], content=data, headers=headers).raise_for_status()

        rw.client_round(spec, out, send)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.sf_round")
    p.add_argument("--role", required=True, choices=["leaf", "top", "client"])
    p.add_argument("--config", help="leaf/top: the round's sf.json; client: its spec JSON")
    p.add_argument("--server", type=int, default=0, help="leaf: which leaf server this is")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-file", help="the token this server accepts (a 0600 file)")
    p.add_argument("--top-token-file", help="leaf: the token the top accepts (a 0600 file)")
    p.add_argument("--out", help="client: where its marks go")
    a = p.parse_args(argv)
    if a.role == "client":
        _client_main(Path(a.config), Path(a.out))
        return 0
    cfg = json.loads(Path(a.config).read_text())
    spec = model_spec(cfg["layout"])
    leaves = [Leaf(lid, srv, tuple(cl)) for lid, srv, cl in cfg["leaves"]]
    if a.role == "top":
        _serve(TopServer(spec, len(leaves), cfg["clients"]).app(read_token(a.token_file)), a.port)
        return 0
    mine = [leaf for leaf in leaves if leaf.server == a.server]
    server = LeafServer(spec, mine, cfg["top_url"], read_token(a.top_token_file))
    _serve(server.app(read_token(a.token_file)), a.port)
    return 0


# ----------------------------------------------------------------------------- the server side
def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.harness.sf_round", *argv],
            cwd=ROOT,
            env={**os.environ, **PINNED_THREADS, "PYTHONPATH": str(ROOT)},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class SFServers:
    """The SF round's server side on loopback: one top and ``servers`` leaf servers.

    Writes ``sf.json`` (layout, leaves, clients, top URL) and the two tokens (0600) under
    ``rdir``: ``client.token`` (clients -> leaves) and ``top.token`` (leaves and the harness
    -> top)."""

    def __init__(
        self, rdir: Path, layout: Sequence[tuple[str, Sequence[int]]], leaves: list[Leaf]
    ) -> None:
        from core.services import free_port

        self.rdir, self.leaves = rdir, leaves
        self.clients = sum(len(leaf.clients) for leaf in leaves)
        self.top_port = free_port()
        self.leaf_ports = [free_port() for _ in range(max(leaf.server for leaf in leaves) + 1)]
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.client_token, self.top_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        _write_private(rdir / "client.token", self.client_token)
        _write_private(rdir / "top.token", self.top_token)
        cfg = {
            "layout": [[n, list(s)] for n, s in layout],
            "leaves": [[leaf.id, leaf.server, list(leaf.clients)] for leaf in leaves],
            "clients": self.clients,
            "top_url": self.top_url,
        }
        (rdir / "sf.json").write_text(json.dumps(cfg))

    @property
    def top_url(self) -> str:
        return f"http://127.0.0.1:{self.top_port}"

    def leaf_url(self, leaf: Leaf) -> str:
        return f"http://127.0.0.1:{self.leaf_ports[leaf.server]}/v1/leaves/{leaf.id}/updates"

    def start(self, timeout: float = 60) -> None:
        from core.services import wait_for_port

        common = ["--config", str(self.rdir / "sf.json")]
        top = ["--role", "top", "--port", str(self.top_port), "--token-file"]
        self._add("top", [*top, str(self.rdir / "top.token"), *common])
        for k, port in enumerate(self.leaf_ports):
            argv = ["--role", "leaf", "--server", str(k), "--port", str(port)]
            argv += ["--token-file", str(self.rdir / "client.token")]
            self._add(
                f"leaf server {k}",
                [*argv, "--top-token-file", str(self.rdir / "top.token"), *common],
            )
        for (_, proc, _), port in zip(self.procs, [self.top_port, *self.leaf_ports], strict=True):
            wait_for_port("127.0.0.1", port, timeout, proc)

    def _add(self, name: str, argv: list[str]) -> None:
        log = self.rdir / f"{name.replace(' ', '-')}.log"
        self.procs.append((name, _spawn(argv, log), log))

    def pids(self) -> list[int]:
        return [p.pid for _, p, _ in self.procs if p.poll() is None]

    def get(self, path: str) -> Any:
        """``GET`` a top route with the top's token."""
        import httpx

        auth = {"Authorization": f"Bearer {self.top_token}"}
        r = httpx.get(f"{self.top_url}{path}", headers=auth, timeout=60)
        r.raise_for_status()
        return r

    def kill(self) -> None:
        for pid in rw.tree(self.pids()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for _, p, _ in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGTERM)
        for _, p, _ in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


# ----------------------------------------------------------------------------- the round
METHOD = (
    "window: first client's weights-in-memory mark (before serialisation) -> global model "
    "available (divided, encoded, servable by the top); server window from the first update "
    "bytes received on a leaf server's port (kernel TCP counters, earliest of the leaf ports); "
    "memory: peak over the window of the leaf servers' and the top's pages, sampled every 5 ms "
    "(beside it their summed VmHWM, reset as the window opens, read at the end)"
)


def _start_clients(
    rdir: Path, servers: SFServers, weights: list[Path], clients: int
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """``clients`` client processes; client ``k`` sends ``weights[k % len(weights)]`` with
    ``100 + k`` samples to its leaf."""
    leaf_of = {k: leaf for leaf in servers.leaves for k in leaf.clients}
    out = []
    for k in range(clients):
        sp = rdir / f"client-{k}.json"
        spec = {
            "work": str(rdir),
            "client": f"c{k}",
            "weights": str(weights[k % len(weights)]),
            "url": servers.leaf_url(leaf_of[k]),
            "token": servers.client_token,
            "samples": 100 + k,
        }
        _write_private(sp, json.dumps(spec))
        argv = ["--role", "client", "--config", str(sp), "--out", str(rdir / f"client-{k}.out")]
        log = rdir / f"client-{k}.log"
        out.append((_spawn(argv, log), log))
    return out


def _wait(check: Any, done: Any) -> dict[str, Any] | None:
    """Poll until ``done()``; the failure record ``check()`` returns meanwhile, if any."""
    while (bad := check()) is None:
        if done():
            return None
        time.sleep(0.01)
    return dict(bad)


def run_sf_round(
    work: Path,
    layout: list[tuple[str, list[int]]],
    clients: int,
    *,
    fanout: int = 2,
    leaf_servers: int = 2,
    mem_limit_bytes: int = 0,
    floor_bytes: int | None = None,
    timeout: float = 600.0,
    distinct_weights: bool = False,
    groups: RoundGroups | None = None,
    tag: str = "",
) -> dict[str, Any]:
    """One SF round (module docstring), measured as ``bench.harness.fedfaas_round.bench_round_e2e``
    measures FedFaaS's: ``clients`` client processes released at once, ``ceil(clients /
    fanout)`` leaves on ``leaf_servers`` leaf server processes, one top.

    Every client sends the same weights (one file on /dev/shm, as in the FedFaaS round);
    ``distinct_weights`` gives client ``k`` its own (``write_weights`` with seed ``k``) so that
    a test can check the weighting. The served global model is left in
    ``<work>/sf-<tag><clients>c/global.safetensors``. A point the memory guard stops, that errors or
    times out is a failure record (``ok`` False), not an exception. ``groups``: the round's
    cgroups; the leaf servers and the top are born in ``groups.server``, the clients in
    ``groups.clients``, and the record has ``cgroup`` (each group's peak memory, CPU-seconds
    and threads over the window, :meth:`~bench.harness.cgroups.RoundGroups.close_window`).
    ``tag`` tells runs in the same ``work`` apart (its folder is ``sf-<tag><clients>c``).
    """
    floor = rw.DEFAULT_FLOOR_BYTES if floor_bytes is None else floor_bytes
    size = rw.layout_bytes(layout)
    base = {"clients": clients, "update_bytes": size, "num_tensors": len(layout)}
    rdir = work / f"sf-{tag}{clients}c"
    rdir.mkdir(parents=True)
    (rdir / "layout.json").write_text(json.dumps(layout))
    weights = [
        Path(f"/dev/shm/fedfaas-bench-weights-{os.getpid()}-sf{tag}{clients}c-{k}")
        for k in range(clients if distinct_weights else 1)
    ]
    leaves = plan_leaves(clients, fanout, leaf_servers)
    servers = SFServers(rdir, layout, leaves)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    guard: rw.MemoryGuard | None = None
    peak: rw.PeakMemory | None = None
    firsts: list[rw.FirstBytes] = []

    def kill_all() -> None:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
        servers.kill()

    deadline = time.monotonic() + timeout

    def check() -> dict[str, Any] | None:
        for srv in servers.procs:
            bad = rw.point_failure(
                guard,
                srv,
                procs,
                deadline,
                f"no global model in {timeout:.0f} s",
                server_may_finish=False,
                **base,
            )
            if bad is not None:
                return bad
        return None

    acct: dict[str, Any] | None = None
    try:
        with born_in(groups.server if groups else None):
            servers.start()
        guard = rw.MemoryGuard(
            servers.pids,
            kill_all,
            client_pids=lambda: [p.pid for p, _ in procs],
            limit_bytes=mem_limit_bytes,
            floor_bytes=floor,
        )
        guard.start()
        for k, path in enumerate(weights):
            rw.write_weights(path, layout, seed=k)
        with born_in(groups.clients if groups else None):
            procs = _start_clients(rdir, servers, weights, clients)
        if bad := _wait(check, lambda: len(list(rdir.glob("ready-*"))) >= clients):
            return bad
        idle = rw.summed_rss(servers.pids())
        rw.reset_hwm(servers.pids())  # the peak of the window, not of the start-up
        if groups is not None:
            groups.open_window()
        peak = rw.PeakMemory(servers.pids)
        peak.start()
        firsts = [rw.FirstBytes(port) for port in servers.leaf_ports]
        for f in firsts:
            f.start()
        (rdir / "go").touch()
        if bad := _wait(check, lambda: all(p.poll() is not None for p, _ in procs)):
            return bad
        if bad := _wait(check, lambda: servers.get("/v1/status").json()["published_ns"]):
            return bad
        hwm = rw.summed_hwm(servers.pids())  # at the end, every server process still running
        acct = groups.close_window() if groups is not None else None
        peak.stop()
        st = servers.get("/v1/status").json()
        (rdir / "global.safetensors").write_bytes(servers.get("/v1/model").content)
        marks = [json.loads((rdir / f"client-{k}.out").read_text()) for k in range(clients)]
    except Exception:
        # a request to a server the guard has just stopped: the guard's record is the result
        if guard is not None and guard.tripped is not None:
            return guard.failure(**base)
        raise
    finally:
        for f in firsts:
            f.stop()
        if peak is not None:
            peak.stop()
        if guard is not None:
            guard.stop()
        kill_all()
        servers.stop()
        for path in weights:
            path.unlink(missing_ok=True)
    end = st["published_ns"]
    first_ns = min((f.t_ns for f in firsts if f.t_ns), default=0)
    out = {
        "ok": True,
        **base,
        "method": METHOD,
        "fanout": fanout,
        "leaves": len(leaves),
        "leaf_servers": len(servers.leaf_ports),
        "updates_merged": st["count"],
        "e2e_s": rw.window_s([m["t_start_ns"] for m in marks], end),
        "server_s": rw.window_s([first_ns], end) if first_ns else None,
        "encode_s_max": max(m["t_encoded_ns"] - m["t_start_ns"] for m in marks) / 1e9,
        **rw.sampled_memory(peak, hwm, idle, guard),
        "client_hwm_bytes": sum(int(m["client_hwm_bytes"]) for m in marks),
        "thread_pools": {"client": marks[0]["thread_pools"]},
        "threads_env": dict(PINNED_THREADS),
    }
    if acct is not None:
        out["cgroup"] = acct
    return out


if __name__ == "__main__":
    raise SystemExit(main())
