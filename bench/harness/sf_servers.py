"""The SF round's processes: the leaf servers, the top server and the clients (``python -m
bench.harness.sf_servers --role leaf|top|client``), and the tree they form (:func:`plan_leaves`).

Started and measured by :mod:`bench.harness.sf_round`, whose docstring describes the round.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import round_clients as rc

if TYPE_CHECKING:
    pass


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
    """One client: :func:`~bench.harness.rc.client_round`, POSTing to its leaf."""
    import httpx

    spec = json.loads(spec_path.read_text())
    headers = {"Authorization": f"Bearer {spec['token']}", "X-Sample-Count": str(spec["samples"])}
    with httpx.Client(timeout=600) as c:

        def send(data: bytes) -> None:
            c.post(spec["url"], content=data, headers=headers).raise_for_status()

        rc.client_round(spec, out, send)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.sf_servers")
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


if __name__ == "__main__":
    raise SystemExit(main())
