"""Run node gateways in background threads (own event loop each) for tests and benchmarks."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import httpx
import numpy as np

from core import wire
from gateway import Gateway, GatewaySettings


class GatewayThread:
    """A real :class:`Gateway` on a free loopback port, in a thread of this process."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.gw: Gateway | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"gw-{settings.node}")

    @property
    def url(self) -> str:
        assert self.gw is not None
        return f"{self.settings.scheme}://127.0.0.1:{self.gw.port}"

    def start(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:  # pragma: no cover
            runner = asyncio.Runner()
        with runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.gw = await Gateway(self.settings).start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.gw.stop()

    def call(self, fn, *args):  # type: ignore[no-untyped-def]
        """Run ``fn(*args)`` on the gateway's loop and return its result."""
        assert self._loop is not None
        fut: asyncio.Future = asyncio.run_coroutine_threadsafe(_wrap(fn, *args), self._loop)
        return fut.result(30)

    def stop(self) -> None:
        """Stop the gateway (a second call does nothing)."""
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


async def _wrap(fn, *args):  # type: ignore[no-untyped-def]
    return fn(*args)


def settings(tmp: Path, redis_url: str, node: str = "n1", **kw: object) -> GatewaySettings:
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    base = dict(
        node=node,
        port=0,
        state_dir=tmp / f"state-{node}",
        redis_url=redis_url,
        redis_credentials_file=redis_url.credentials_file("gateway"),  # type: ignore[attr-defined]
        shm_root=root,
        prefer_ebpf=False,
        pool=2,
    )
    base.update(kw)
    return GatewaySettings(**base)  # type: ignore[arg-type]


def tiny_model(seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "layer.weight": (rng.standard_normal((8, 5)) * scale).astype(np.float32),
        "layer.bias": (rng.standard_normal(8) * scale).astype(np.float32),
        "steps": np.array([seed], np.int64),
    }


def tiny_bytes(seed: int = 0, scale: float = 1.0) -> bytes:
    return wire.encode_tensors(tiny_model(seed, scale))


def resume_job(
    gw: GatewayThread,
    clients: list[str],
    rounds: int,
    *,
    goal: int | None = None,
    body: bytes = b"",
) -> httpx.Response:
    """``POST /v1/jobs?resume=true`` for job ``j1`` as the admin: the job comes back from its
    newest MinIO checkpoint (``goal`` defaults to every client)."""
    return httpx.post(
        gw.url + "/v1/jobs",
        params={
            "job": "j1",
            "rounds": rounds,
            "goal": len(clients) if goal is None else goal,
            "clients": ",".join(clients),
            "resume": "true",
        },
        content=body,
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
    )


def delete_and_resume(gw: GatewayThread, clients: list[str], rounds: int, goal: int) -> dict:
    """Flush job ``j1``'s checkpoints, delete the job and resume it from the newest one
    (:func:`resume_job`, no body); the gateway's answer to the resumption."""
    assert gw.gw is not None and gw.gw.checkpoints is not None
    assert gw.gw.checkpoints.flush(60)
    admin = {"Authorization": f"Bearer {gw.gw.secret}"}
    assert httpx.delete(gw.url + "/v1/jobs/j1", headers=admin).status_code == 204
    r = resume_job(gw, clients, rounds, goal=goal)
    assert r.status_code == 201, r.text
    return dict(r.json())
