"""The control plane's scale calls to the provider retry what may pass, and the loop survives
what does not.

faas-netes answers 500 "unable to update function deployment" when its Deployment write meets
another writer's (seen in CI, 540cca6). A 5xx or no answer is asked again (three tries over
about 1.5 s); a 4xx is not; a call that still fails is logged, counted (``scale_failures``,
``GET /v1/nodes``' ``autoscale.failures``, the metric
``fedfaas_control_autoscale_failures_total``) and shown (``scale_error``, ``autoscale.error``),
and the control loop goes on and scales once the provider answers again.

The provider here is a small HTTP server on loopback that answers the two OpenFaaS routes the
autoscaler calls with scripted statuses: it stands in for the provider's HTTP API; the logic
under test is the client's retrying and the loop's survival. The nodes are the control tests'
gateway stand-ins, whose reported aggregator load asks for one more replica.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from control_plane.api import metrics_text
from control_plane.coordinator import Coordinator
from core.openfaas import AsyncOpenFaaS
from core.services import free_port
from tests.control.conftest import GatewayProc
from tests.polling import wait_until
from tests.tls.certs import JsonHandler
from tests.tokens import control_client

pytestmark = pytest.mark.integration

FUNCTION = "agg"


class Provider:
    """``GET /system/function/agg`` (1 replica of at most 5) and ``POST
    /system/scale-function/agg`` answered with the next of :attr:`script` (then 200)."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.scales: list[dict[str, Any]] = []  # the bodies of every scale request, in order
        self.replicas = 1
        provider = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != f"/system/function/{FUNCTION}":
                    return self.reply(404, {"error": "no such function"})
                n = provider.replicas
                self.reply(
                    200,
                    {
                        "name": FUNCTION,
                        "replicas": n,
                        "availableReplicas": n,
                        "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "5"},
                    },
                )

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                provider.scales.append(body)
                status = provider.script.pop(0) if provider.script else 200
                if status == 200:
                    provider.replicas = int(body["replicas"])
                    return self.reply(200, {})
                self.reply(status, {"error": "unable to update function deployment"})

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def provider() -> Iterator[Provider]:
    p = Provider()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture()
def busy_node(gateways: list[GatewayProc]) -> Iterator[GatewayProc]:
    """node1 reports its 2 endpoints busy and a slot waiting: the autoscaler wants 2 replicas."""
    g = gateways[0]
    load = {"endpoints": 2, "free_endpoints": 0, "waiting_slots": 1, "queue": 0.0}
    assert httpx.put(f"{g.url}/_standin/aggregators", json=load).status_code == 200
    try:
        yield g
    finally:
        httpx.put(f"{g.url}/_standin/aggregators", json={**load, "waiting_slots": 0})


def _coordinator(url: str, node: GatewayProc) -> Coordinator:
    return Coordinator(
        {node.name: node.url}, provider=AsyncOpenFaaS(url, ("admin", "pw")), function=FUNCTION
    )


def _one_tick(url: str, node: GatewayProc) -> Coordinator:
    """One control tick of a coordinator scaling through the provider at ``url``."""

    async def go() -> Coordinator:
        coord = _coordinator(url, node)
        try:
            await coord.tick()
            return coord
        finally:
            await coord.stop()

    return asyncio.run(go())


def test_a_500_is_asked_again_and_the_scale_lands(provider: Provider, busy_node) -> None:  # type: ignore[no-untyped-def]
    provider.script = [500]

    coord = _one_tick(provider.url, busy_node)
    assert [b["replicas"] for b in provider.scales] == [2, 2]  # the 500, then the 200
    assert (coord.last_scale, coord.scale_error, coord.scale_failures) == (2, None, 0)
    assert provider.replicas == 2


def test_a_4xx_is_not_asked_again_and_is_shown(provider: Provider, busy_node) -> None:  # type: ignore[no-untyped-def]
    provider.script = [403]

    coord = _one_tick(provider.url, busy_node)
    assert len(provider.scales) == 1
    assert coord.scale_failures == 1 and coord.last_scale is None
    assert coord.scale_error is not None and "answered 403" in coord.scale_error
    assert "tries" not in coord.scale_error
    assert "fedfaas_control_autoscale_failures_total 1.0" in metrics_text(coord).decode()


def test_a_provider_that_keeps_failing_leaves_the_loop_running_and_saying_so(
    provider: Provider,
    busy_node,  # type: ignore[no-untyped-def]
) -> None:
    """The control plane's own loop (its app, ticking every 0.05 s) survives tick after tick
    of 500s, says so in ``GET /v1/nodes`` and ``GET /metrics``, and scales once the provider
    answers again."""
    provider.script = [500] * 1000
    coord = _coordinator(provider.url, busy_node)
    with control_client(coord, tick_s=0.05) as api:

        def autoscale() -> dict[str, Any]:
            view: dict[str, Any] = api.get("/v1/nodes").json()["autoscale"]
            return view

        view = wait_until(lambda: (v := autoscale())["failures"] >= 2 and v, 60, "2 failures")
        assert "answered 500" in view["error"] and "(3 tries)" in view["error"], view
        assert len(provider.scales) >= 6  # three tries a tick
        [line] = [
            ln
            for ln in api.get("/metrics").text.splitlines()
            if ln.startswith("fedfaas_control_autoscale_failures_total ")
        ]
        assert float(line.split()[1]) >= 2, line
        provider.script.clear()  # the provider answers again: the same loop scales
        view = wait_until(lambda: (v := autoscale())["replicas"] == 2 and v, 60, "the scale")
        assert view["error"] is None and provider.replicas == 2


def test_a_provider_that_does_not_answer_is_asked_three_times(busy_node) -> None:  # type: ignore[no-untyped-def]
    coord = _one_tick(f"http://127.0.0.1:{free_port()}", busy_node)  # nobody listens there
    assert coord.scale_failures == 1 and coord.scale_error is not None
    assert "cannot reach" in coord.scale_error and "(3 tries)" in coord.scale_error
