"""The console's data plane and client revocation, on real services (no browser).

Two real node gateways (``python -m gateway``, userspace router, aggregator replicas
registered, real Redis) and the real control plane (``python -m control_plane``) behind the
console app: the admin sees each node's router endpoints with their counters and its store
and ingest grow with an update; the admin revokes a client, and its token is then refused at
every gateway; the analyst may do neither; bad input gets a clear 4xx. With Debian's
Prometheus scraping the gateways (their admin secret from its file), the ingest rates are
Prometheus' own.
``tests/console/test_console_browser.py`` shows the same pages in Chromium.
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save

from console.app import create_app
from console.settings import ConsoleSettings
from console.upstream import PROMETHEUS_WINDOW_S
from control_plane.settings import ControlPlaneSettings
from core.auth import bearer, write_token_file
from core.services import PrometheusServer, free_port, wait_for_port
from tests.console.test_console_app import login
from tests.control import realgw

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 16-75 s on 2 loaded cores

ANALYST = "analyst-token-of-the-console-services-test"
JOB = "dp"
W0 = {"a": np.zeros(4096, np.float32)}


def _wait(what: str, ok: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := ok()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)
    return got


@contextmanager
def _control_plane(urls: dict[str, str], tmp_path: Path, analyst: Path) -> Iterator[str]:
    port = free_port()
    settings = ControlPlaneSettings(
        port=port,
        gateways=",".join(f"{n}={u}" for n, u in urls.items()),
        tick_s=0.1,
        mc=3.0,
        admin_token_file=tmp_path / "secret",  # the gateways' admin secret (realgw)
        analyst_token_file=analyst,
    )
    with open(tmp_path / "control-plane.log", "wb") as log:
        proc = subprocess.Popen(settings.to_argv(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def _prometheus(urls: dict[str, str], tmp_path: Path) -> Iterator[PrometheusServer]:
    prom = PrometheusServer(
        data_dir=tmp_path / "prometheus",
        bearer_targets=[urlsplit(u).netloc for u in urls.values()],
        bearer_file=tmp_path / "secret",
    ).start()
    try:
        yield prom
    finally:
        prom.stop()


def _nodes(console: TestClient) -> dict[str, dict[str, Any]]:
    resp = console.get("/api/dataplane")
    assert resp.status_code == 200, resp.text
    return {n["node"]: n for n in resp.json()["nodes"]}


def test_the_data_plane_and_a_revocation_through_the_console(redis_url, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    analyst = write_token_file(tmp_path / "analyst", ANALYST)
    with (
        realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs),
        _control_plane(urls, tmp_path, analyst) as cp,
        _prometheus(urls, tmp_path) as prom,
    ):
        settings = ConsoleSettings(
            admin_token_file=tmp_path / "secret",
            analyst_token_file=analyst,
            control_plane_url=cp,
            gateways=",".join(f"{n}={u}" for n, u in urls.items()),
        )
        created = httpx.post(
            f"{cp}/v1/jobs",
            json={
                "job": JOB,
                "rounds": 2,
                "goal": 2,
                "clients": 4,
                "weights_b64": base64.b64encode(save(W0)).decode(),
            },
            headers=bearer(secret),
            timeout=60,
        )
        assert created.status_code == 201, created.text
        tokens: dict[str, str] = created.json()["tokens"]

        def assignment(c: str) -> httpx.Response:
            return httpx.get(
                f"{cp}/v1/jobs/{JOB}/assignment", params={"client": c}, headers=bearer(tokens[c])
            )

        where = _wait(
            "round 1 open",
            lambda: {
                c: r.json()["gateway_url"]
                for c in tokens
                if (r := assignment(c)).status_code == 200
            },
        )

        with TestClient(create_app(settings), base_url="http://127.0.0.1") as console:
            # the analyst sees neither the data plane nor may revoke
            csrf = login(console, ANALYST)
            assert console.get("/api/dataplane").status_code == 403
            assert "/dataplane" not in console.get("/").text  # nor its link
            resp = console.post(
                f"/api/jobs/{JOB}/clients/c0/revoke", headers={"X-CSRF-Token": csrf}
            )
            assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
            console.cookies.clear()

            csrf = login(console, secret)
            assert "href='/dataplane'" in console.get("/").text
            assert console.get("/dataplane").status_code == 200
            before = _nodes(console)
            assert set(before) == set(urls)
            for n in before.values():
                assert n["router"]["mode"] == "userspace", n  # realgw: no eBPF
                roles = {e["role"] for e in n["endpoints"]}
                assert any(r.startswith("aggregator") for r in roles), n  # replicas registered
                for e in n["endpoints"]:
                    assert isinstance(e["msgs_received"], int) and isinstance(e["drops"], int)
                assert n["metrics"]["store_objects"] >= 0 and isinstance(n["drops"], dict)
            # the job's initial model is in its root node's store
            assert any(n["metrics"]["store"].get(JOB, {}).get("objects") for n in before.values())

            # Prometheus scrapes both gateways (their admin secret from its file) before the
            # update comes: its rate needs a sample from before the rise
            _wait(
                "Prometheus scraping both gateways",
                lambda: sum(float(r["value"][1]) for r in prom.query("up")) == len(urls),
            )
            sender = sorted(where)[0]
            node = next(n for n, u in urls.items() if u == where[sender])
            sent = save({"a": np.ones(4096, np.float32)})
            up = realgw.upload(
                where[sender],
                JOB,
                1,
                sender,
                tokens[sender],
                W0 | {"a": np.ones(4096, np.float32)},
                1,
            )
            assert up.status_code == 202, up.text

            def grown() -> dict[str, Any] | None:
                n = _nodes(console)[node]
                m = n["metrics"]
                took = m["ingest_bytes"] - before[node]["metrics"]["ingest_bytes"]
                if took >= len(sent) and m["updates_accepted"] >= 1 and m["ingest_bytes_per_s"]:
                    return n
                return None

            after = _wait(f"{node}'s ingest and its rate", grown)
            assert after["metrics"]["store"][JOB]["objects"] >= 1
            assert after["metrics"]["ingest_bytes_per_s"] > 0

            # with a Prometheus scraping the gateways, the rates are its own
            scraped = ConsoleSettings(**{**settings.model_dump(), "prometheus_url": prom.url})
            with TestClient(create_app(scraped), base_url="http://127.0.0.1") as seen:
                login(seen, secret)

                def from_prometheus() -> dict[str, Any] | None:
                    d = seen.get("/api/dataplane").json()
                    rate = {n["node"]: n["metrics"]["ingest_bytes_per_s"] for n in d["nodes"]}
                    return d if d["rates_from"] == "prometheus" and rate[node] else None

                d = _wait("the ingest rate from Prometheus", from_prometheus)
                assert d["window_s"] == PROMETHEUS_WINDOW_S and not d["errors"], d

            # revocation: bad input first, then a client that was selected and did not send
            h = {"X-CSRF-Token": csrf}
            assert console.post(f"/api/jobs/{JOB}/clients/c0/revoke").status_code == 403
            bad = console.post(f"/api/jobs/{JOB}/clients/no%20such%20id!/revoke", headers=h)
            assert bad.status_code == 400 and "client" in bad.json()["detail"], bad.text
            bad = console.post(f"/api/jobs/{JOB}/clients/c0/revoke?force=maybe", headers=h)
            assert bad.status_code == 400 and "force" in bad.json()["detail"], bad.text
            unknown = console.post(f"/api/jobs/{JOB}/clients/zz/revoke", headers=h)
            assert unknown.status_code == 404, unknown.text
            assert unknown.json()["detail"]["error"] == "unknown_client"

            gone = next(c for c in sorted(where) if c != sender)
            done = console.post(f"/api/jobs/{JOB}/clients/{gone}/revoke", headers=h)
            assert done.status_code == 200, done.text
            assert done.json()["revoked"] == [gone]
            assert sorted(done.json()["gateways"]) == sorted(urls)
            for url in urls.values():  # every gateway refuses its uploads now
                res = realgw.upload(url, JOB, 1, gone, tokens[gone], W0, 1)
                assert res.status_code == 403 and res.json()["error"] == "client_revoked"
            assert assignment(gone).status_code == 403
            view = console.get(f"/api/jobs/{JOB}").json()["view"]
            assert view["revoked"] == [gone]
            # two more would leave fewer than the goal: refused without force, 409
            left = [c for c in sorted(tokens) if c not in (gone, sender)]
            assert (
                console.post(f"/api/jobs/{JOB}/clients/{left[0]}/revoke", headers=h).status_code
                == 200
            )
            short = console.post(f"/api/jobs/{JOB}/clients/{left[1]}/revoke", headers=h)
            assert short.status_code == 409, short.text
            assert short.json()["detail"]["error"] == "too_few_clients"
            forced = console.post(f"/api/jobs/{JOB}/clients/{left[1]}/revoke?force=true", headers=h)
            assert forced.status_code == 200 and len(forced.json()["revoked"]) == 3, forced.text
