"""A part that starts before Redis listens waits for it (core.redis_wait), as the chart's pods
and faasd's containers start together: the node gateway and the control plane's Redis store
come up once a real Redis starts a few seconds after them; a Redis that refuses the part's
credentials, or never comes, still stops the start saying why."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.exceptions as rex

from control_plane.store import RedisStore
from core.redis_wait import wait_for_redis
from core.secretfiles import async_redis_client
from core.services import free_port
from core.services.redis_server import RedisServer
from tests.dataplane.gwutil import GatewayThread, settings

pytestmark = pytest.mark.integration

LATE_S = 2.0


class LateRedisURL(str):
    """A Redis URL whose server starts :data:`LATE_S` seconds after :meth:`start_later`."""

    server: RedisServer

    def credentials_file(self, user: str) -> Path:
        return self.server.credentials_file(user)


@pytest.fixture()
def late_redis(tmp_path: Path) -> Iterator[LateRedisURL]:
    server = RedisServer(data_dir=tmp_path / "redis", port=free_port("127.0.0.1"))
    server.prepare()  # the users' credentials files exist before the server listens
    url = LateRedisURL(server.url)
    url.server = server
    yield url
    server.stop()


def _start_later(url: LateRedisURL) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(LATE_S), url.server.start()), daemon=True)
    t.start()
    return t


def test_a_gateway_started_before_redis_listens_waits_and_serves(
    late_redis: LateRedisURL, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="core.redis_wait")
    started = _start_later(late_redis)
    gw = GatewayThread(settings(tmp_path, late_redis)).start()
    try:
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        assert any("Redis does not answer yet" in r.getMessage() for r in caplog.records)
        assert late_redis.server.ping()
    finally:
        gw.stop()
        started.join()


def test_the_control_planes_redis_store_waits_for_a_late_redis(late_redis: LateRedisURL) -> None:
    started = _start_later(late_redis)

    async def main() -> dict:
        store = RedisStore(late_redis, late_redis.credentials_file("control-plane"))
        t0 = time.monotonic()
        await store.wait_up()
        waited = time.monotonic() - t0
        await store.save("j", {"x": 1})
        return {"waited": waited, "all": await store.load_all()}

    got = asyncio.run(main())
    started.join()
    assert got["all"] == {"j": {"x": 1}}
    assert got["waited"] > 0  # it did wait: Redis was not there when it asked


def test_wrong_credentials_stop_at_once_and_no_redis_stops_after_the_wait(
    late_redis: LateRedisURL, tmp_path: Path
) -> None:
    late_redis.server.start()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"username": "gateway", "password": "not-its-password"}))
    wrong.chmod(0o600)

    async def refused() -> float:
        t0 = time.monotonic()
        with pytest.raises(rex.AuthenticationError):
            await wait_for_redis(async_redis_client(late_redis, wrong), "test", wait_s=30)
        return time.monotonic() - t0

    assert asyncio.run(refused()) < 10  # not the 30 s wait: waiting cannot mend it

    nobody = f"redis://127.0.0.1:{free_port('127.0.0.1')}/0"

    async def absent() -> None:
        client = async_redis_client(nobody, late_redis.credentials_file("gateway"))
        with pytest.raises(rex.ConnectionError):
            await wait_for_redis(client, "test", wait_s=1.0)

    asyncio.run(absent())
