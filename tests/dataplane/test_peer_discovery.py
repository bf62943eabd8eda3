"""A node gateway with ``--peers-service`` (:mod:`core.discovery`) stops cleanly on SIGTERM.

Its discovery task looks the peers up every ``discovery_interval`` seconds; on SIGTERM it ends
with the gateway's other tasks (status 0, no "did not stop" line), whether the name resolves
(to the gateway itself, which it leaves out of its peers) or not. The peers it finds are used
for cross-node partials and the model in ``tests/control/test_discovery.py``; here, how the
peer map is merged: ``peers`` entries win, the gateway's own node is left out.
"""

from __future__ import annotations

import asyncio
import shutil
import signal

import httpx
import pytest

from bench.stack import start_gateway
from gateway.core import Gateway
from gateway.settings import GatewaySettings
from tests.dataplane.gwproc import gateway_settings
from tests.polling import wait_until


@pytest.mark.integration
@pytest.mark.parametrize("name", ["localhost", "no-such-peers.invalid"])
def test_a_gateway_discovering_its_peers_stops_cleanly_on_sigterm(tmp_path, redis_url, name):
    s = gateway_settings(tmp_path, redis_url, discovery_interval=0.1)
    s = s.model_copy(update={"peers_service": f"{name}:{s.port}"})
    log = tmp_path / "gateway.log"
    gw = start_gateway(s, log, log_level="INFO")
    try:
        assert gw.health()["node"] == "n1"
        # several lookups (and, for localhost, /healthz probes of itself), waited for in the
        # gateway's log: a fixed 1 s let a slow first lookup miss the SIGTERM (shown by
        # delaying Discovery.find by 1.5 s)
        marker = "/healthz" if name == "localhost" else "does not resolve"
        wait_until(lambda: log.read_text().count(marker) >= 2, 60, f"two lines with {marker!r}")
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(s.stop_grace + 10) == 0, log.read_text()[-3000:]
    finally:
        if gw.proc.poll() is None:
            gw.proc.kill()
            gw.proc.wait(10)
        shutil.rmtree(s.shm_root, ignore_errors=True)
    text = log.read_text()
    assert "did not stop" not in text and "gateway n1 stopped" in text
    if name == "localhost":  # it found only itself: no peer
        assert "peers discovered" not in text
        assert "/healthz" in text  # it did probe
    else:
        assert "does not resolve" in text
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=1)


def test_static_peers_win_over_discovered_ones_and_the_node_itself_is_left_out(tmp_path):
    s = GatewaySettings(
        node="n1",
        state_dir=tmp_path,
        peers={"n2": "http://10.0.0.2:81"},
        peers_service="peers.example:81",
    )

    async def run() -> None:
        gw = Gateway(s)
        try:
            await gw._found_peers(
                {"n1": "http://10.9.0.1:81", "n2": "http://10.9.0.2:81", "n3": "http://10.9.0.3:81"}
            )
            assert gw.peer_url("n2") == "http://10.0.0.2:81"  # the setting
            assert gw.peer_url("n3") == "http://10.9.0.3:81"  # discovered
            assert gw.peer_url("n1") is None  # itself
            await gw._found_peers({"n2": "http://10.9.0.2:81"})  # n3 gone from the name
            assert gw.peer_url("n3") is None
        finally:
            await gw.peers.aclose()
            await gw.discovery.aclose()  # type: ignore[union-attr]

    asyncio.run(run())
