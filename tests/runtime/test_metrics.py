"""GET /metrics: the OpenFaaS gateway's metric names, counted from real invocations; basic auth."""

from __future__ import annotations

import re

import httpx
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import available, client, echo_body

pytestmark = pytest.mark.integration


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` in a Prometheus text exposition (0 if absent)."""
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if m and m.group(1) == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if found == labels:
                return float(m.group(3))
    return 0.0


def test_invocations_are_counted_under_the_gateway_names(runtime: RuntimeProcess) -> None:
    with client(runtime, timeout=60) as http:
        assert http.post("/system/functions", json=echo_body("metered")).status_code == 202
        try:
            wait_until(lambda: available(http, "metered") == 1, timeout=60)
            for body in (b"one", b"two"):
                assert http.post("/function/metered", content=body).content == body
            no_token = httpx.post(f"{runtime.url}/function/metered", content=b"x")
            assert no_token.status_code == 401

            assert httpx.get(f"{runtime.url}/metrics").status_code == 401  # basic auth
            fn = "metered.openfaas-fn"

            def counted() -> str | None:
                """The exposition once it counts the three calls: the runtime counts a call
                once its answer is out, so the caller can ask before the last one is counted."""
                r = httpx.get(f"{runtime.url}/metrics", auth=runtime.auth)
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
                done = _sample(
                    r.text, "gateway_functions_seconds_count", code="200", function_name=fn
                )
                done += _sample(
                    r.text, "gateway_function_invocation_total", code="401", function_name=fn
                )
                return r.text if done >= 3 else None

            text = wait_until(counted, timeout=30, what="the three calls counted")
            assert (
                _sample(text, "gateway_function_invocation_total", code="200", function_name=fn)
                == 2
            )
            assert (
                _sample(text, "gateway_function_invocation_total", code="401", function_name=fn)
                == 1
            )
            assert (
                _sample(text, "gateway_functions_seconds_count", code="200", function_name=fn) == 2
            )
            assert _sample(text, "gateway_service_count", function_name=fn) == 1
        finally:
            http.request("DELETE", "/system/functions", json={"functionName": "metered"})
