"""A node gateway with ``--peers-service`` (:mod:`fedfaas.discovery`) stops cleanly on SIGTERM.

Its discovery task looks the peers up every ``discovery_interval`` seconds; on SIGTERM it ends
with the gateway's other tasks (status 0, no "did not stop" line), whether the name resolves
(to the gateway itself, which it leaves out of its peers) or not. The peers it finds are used
for cross-node partials and the model in ``tests/control/test_discovery.py``.
"""

from __future__ import annotations

import shutil
import signal
import time

import httpx
import pytest

from bench.stack import start_gateway
from tests.dataplane.gwproc import gateway_settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["localhost", "no-such-peers.invalid"])
def test_a_gateway_discovering_its_peers_stops_cleanly_on_sigterm(tmp_path, redis_url, name):
    s = gateway_settings(tmp_path, redis_url, discovery_interval=0.1)
    s = s.model_copy(update={"peers_service": f"{name}:{s.port}"})
    log = tmp_path / "gateway.log"
    gw = start_gateway(s, log, log_level="INFO")
    try:
        assert gw.health()["node"] == "n1"
        time.sleep(1.0)  # several lookups (and, for localhost, /healthz probes of itself)
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
