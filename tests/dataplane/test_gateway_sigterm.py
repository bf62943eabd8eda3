"""A node gateway that served a round of ResNet-18-sized updates exits on SIGTERM (issue 18).

A gateway subprocess (``python -m gateway``, userspace router, its own store root) with two
``aggregator`` replicas; one job whose model is a single tensor of 11,181,642 float32 (ResNet-18's
parameter count); a round of N clients uploading 4 at a time, published; then SIGTERM. The
gateway must exit cleanly (status 0, not the forced exit of its grace watchdog) well within its
grace period, and the journal in Redis must hold every update it acknowledged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bench.stack import Replicas, start_gateway
from client.sdk import FLClient, create_job
from core import wire
from gateway.journal import PREFIX
from tests.dataplane.gwproc import gateway_settings

pytestmark = pytest.mark.integration

RESNET18_PARAMS = 11_181_642
GRACE = 20.0


def bodies(n: int) -> list[bytes]:
    rng = np.random.default_rng(18)
    return [
        wire.encode_tensors(
            {"w": (rng.standard_normal(RESNET18_PARAMS, dtype=np.float32) * 0.05).astype("<f4")}
        )
        for _ in range(n)
    ]


def round_then_sigterm(
    tmp_path: Path,
    redis_url: str,
    n_clients: int,
    ups: list[bytes],
    *,
    wait_publish: bool = True,
    rounds: int = 2,
) -> None:
    """One gateway life: a round of ``n_clients`` uploads (4 at a time), then SIGTERM with the
    clients' keep-alive connections still open (``wait_publish``: once the round is
    published, else as soon as the last upload is acknowledged)."""
    (tmp_path / "gw").mkdir(parents=True)
    s = gateway_settings(tmp_path, redis_url, stop_grace=GRACE)
    shm = s.shm_root
    log_path = tmp_path / "gateway.log"
    gw = start_gateway(s, log_path, log_level="INFO")
    aggs = Replicas(gw, tmp_path / "aggregators")
    try:
        aggs.spawn(2, endpoints=1)
        aggs.wait_registered(2)
        clients = [f"c{i}" for i in range(n_clients)]
        job = create_job(
            gw.url, gw.secret(), "big", ups[0], rounds=rounds, goal=n_clients, clients=clients
        )
        fl = [FLClient(gw.url, "big", c, job.tokens[c], timeout=120) for c in clients]

        def up(i: int) -> None:
            assert fl[i].upload(1, ups[i % len(ups)], 10 + i).round == 1

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(up, range(n_clients)))
        if wait_publish:
            assert fl[0].wait_for_version(1, timeout=120).version == 1

        t0 = time.monotonic()
        os.kill(gw.pid, signal.SIGTERM)
        try:
            rc = gw.proc.wait(GRACE + 10)
        except subprocess.TimeoutExpired:
            os.kill(gw.pid, signal.SIGUSR1)  # thread stacks into the log
            time.sleep(1)
            rc = None
        took = time.monotonic() - t0
        tail = log_path.read_text(errors="replace")[-6000:]
        assert rc == 0, f"gateway exit {rc} after {took:.1f}s (0 = clean stop)\n{tail}"
        print(f"gateway stopped in {took:.2f}s")
        assert took < GRACE, f"clean stop took {took:.1f}s\n{tail}"
        for c in fl:
            c.close()

        r = redis_url.client()
        try:
            journal = r.hgetall(f"{PREFIX}job:big:round:1")
            assert sorted(k.decode() for k in journal) == sorted(clients)
            assert all("key" in json.loads(v) for v in journal.values())
            if wait_publish:
                assert int(r.hget(f"{PREFIX}job:big:state", "version") or 0) == 1
        finally:
            r.close()
    finally:
        gw.stop(5)
        aggs.stop()
        shutil.rmtree(shm, ignore_errors=True)


@pytest.fixture(scope="module")
def updates() -> list[bytes]:
    return bodies(4)


@pytest.mark.slow  # over 5 s: `make test-slow`
def test_gateway_exits_cleanly_on_sigterm_after_a_resnet18_round(
    tmp_path: Path, redis_url: str, updates: list[bytes]
) -> None:
    for i in range(3):
        round_then_sigterm(tmp_path / f"run{i}", redis_url, 20, updates)
        redis_url.client().flushall()


@pytest.mark.slow
@pytest.mark.parametrize("run", range(6))
def test_gateway_exits_cleanly_on_sigterm_after_a_round_of_120_resnet18_updates(
    tmp_path: Path, redis_url: str, updates: list[bytes], run: int
) -> None:
    round_then_sigterm(tmp_path, redis_url, 120, updates)


STUBBORN = """
import asyncio, logging, signal, sys
from core.shutdown import Shutdown

logging.basicConfig(level=logging.INFO)


async def stubborn() -> None:  # a task that outlives cancellation
    while True:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass


async def main() -> None:
    sh = Shutdown(float(sys.argv[1]))
    loop = sh.loop = asyncio.get_running_loop()
    loop.create_task(stubborn(), name="the-stubborn-task")
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, sh.signal, stop.set)
    print("ready", flush=True)
    await stop.wait()


with asyncio.Runner() as r:
    r.run(main())
"""


@pytest.mark.parametrize("second_signal", [False, True])
def test_a_stop_that_hangs_is_forced_after_the_grace_or_a_second_signal(
    second_signal: bool,
) -> None:
    grace = 30.0 if second_signal else 2.0
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen(
        [sys.executable, "-c", STUBBORN, str(grace)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        if second_signal:
            time.sleep(0.5)
            p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=grace + 10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert took < (5 if second_signal else grace + 5), took
    why = "a second signal" if second_signal else f"{grace:g}s grace"
    assert f"stop not finished after {why}" in err, err
    assert "the-stubborn-task" in err and "stubborn" in err, err  # what was abandoned


def test_a_cancel_lost_in_a_journal_call_does_not_keep_the_gateway_alive(make_gw) -> None:  # type: ignore[no-untyped-def]
    """Issue 18's cause: redis-py can lose a cancel that lands in a call, and the
    housekeeping loop (``while True`` around ``_load_jobs``) then outlived every cancel,
    hanging ``asyncio.Runner.close``. It must end on the stop flag and the stop must wait
    for it."""
    import asyncio
    import contextlib
    import threading

    g = make_gw()
    gw = g.gw
    inside = threading.Event()

    async def lossy() -> None:  # a journal call that loses every cancel, as redis-py may
        inside.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 2
        while loop.time() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(end - loop.time())

    def patch() -> None:
        gw._load_jobs = lossy

    g.call(patch)
    assert inside.wait(10)
    tasks = list(gw.background.tasks)
    t0 = time.monotonic()
    g.stop()
    took = time.monotonic() - t0
    assert not g._thread.is_alive(), "the gateway's loop did not finish (Runner.close hangs)"
    assert took < 10, took
    assert all(t.done() for t in tasks)
