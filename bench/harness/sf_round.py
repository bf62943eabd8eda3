"""The SF round: serverful aggregators that pass whole objects to each other over HTTP.

LIFL's serverful baseline (DESIGN.md, "key handoff ... HTTP copy of the update (SF)"), built as
a peer of the FedFaaS round in ``bench.dataplane`` and measured the same way
(:mod:`bench.harness.round_window`):

- **clients** (``--role client``, one process each, released at once by a ``go`` file) hold the
  weights as numpy arrays (:func:`~bench.harness.rc.map_weights`), mark
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

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.harness.cgroups import born_in
from bench.harness.sf_servers import Leaf, plan_leaves
from bench.runinfo import PINNED_THREADS, ROOT

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups


# ----------------------------------------------------------------------------- the server side
def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.harness.sf_servers", *argv],
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
    ``<work>/sf-<tag><clients>c<MB>m/global.safetensors`` (``MB``: the update's size in whole
    MB). A point the memory guard stops, that errors or
    times out is a failure record (``ok`` False), not an exception. ``groups``: the round's
    cgroups; the leaf servers and the top are born in ``groups.server``, the clients in
    ``groups.clients``, and the record has ``cgroup`` (each group's peak memory, CPU-seconds
    and threads over the window, :meth:`~bench.harness.cgroups.RoundGroups.close_window`).
    ``tag`` tells runs of one size in the same ``work`` apart.
    """
    floor = rw.DEFAULT_FLOOR_BYTES if floor_bytes is None else floor_bytes
    size = rc.layout_bytes(layout)
    base = {"clients": clients, "update_bytes": size, "num_tensors": len(layout)}
    # the size too, as the FedFaaS round's node name: bench.scale's size axis runs SF at one
    # client count and one tag per repeat in one ``work`` (at 1d83e63, without it, the second
    # size's SF runs all failed on the first size's folder: FileExistsError)
    name = f"{tag}{clients}c{size // 1_000_000}m"
    rdir = work / f"sf-{name}"
    rdir.mkdir(parents=True)
    (rdir / "layout.json").write_text(json.dumps(layout))
    weights = [
        Path(f"/dev/shm/fedfaas-bench-weights-{os.getpid()}-sf{name}-{k}")
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
            rc.write_weights(path, layout, seed=k)
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
        "server_s": rw.server_window_s(first_ns, end),  # from the earliest leaf port's mark
        "encode_s_max": max(m["t_encoded_ns"] - m["t_start_ns"] for m in marks) / 1e9,
        **rw.sampled_memory(peak, hwm, idle, guard),
        "client_hwm_bytes": sum(int(m["client_hwm_bytes"]) for m in marks),
        "thread_pools": {"client": marks[0]["thread_pools"]},
        "threads_env": dict(PINNED_THREADS),
    }
    if acct is not None:
        out["cgroup"] = acct
    return out
