"""A client whose training failed leaves its round (``POST .../rounds/{r}/failures``), on the
control plane driving real node gateways (``tests.control.realgw``).

The round goes on with the others under the job's ``min_updates`` and closes as soon as
they are in (the deadline is 600 s; every wait here is far shorter), with the FedAvg of
exactly their updates; when the others cannot meet the minimum, the job fails at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from control_plane.coordinator import Coordinator
from core.auth import bearer
from core.services import RedisServer
from tests.conftest import RedisURL
from tests.control import realgw
from tests.tokens import control_client

pytestmark = pytest.mark.integration

W0 = {"a": np.zeros(24, np.float32)}


@pytest.fixture(scope="module")
def gateways(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], str]]:
    """Two real node gateways for the module (each test has a job of its own)."""
    url = RedisURL(redis_server.url)
    url.server = redis_server
    with realgw.real_gateways(url, tmp_path_factory.mktemp("gw")) as (urls, secret, _procs):
        yield urls, secret


@pytest.fixture()
def api(gateways: tuple[dict[str, str], str]) -> Iterator[Any]:
    urls, secret = gateways
    with control_client(Coordinator(urls, mc=2.0, admin_token=secret), secret, tick_s=0.05) as c:
        yield c


def _view(api: Any, job: str, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = api.get(f"/v1/jobs/{job}").json()
        if pred(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def _fail(api: Any, job: str, rnd: int, client: str, token: str, **body: Any) -> httpx.Response:
    resp: httpx.Response = api.post(
        f"/v1/jobs/{job}/rounds/{rnd}/failures",
        params={"client": client},
        json={"client": client, "error": "RuntimeError: boom", **body},
        headers=bearer(token),
    )
    return resp


def _upload(
    api: Any, job: str, rnd: int, client: str, tokens: dict[str, str], seed: int
) -> tuple[dict[str, np.ndarray], int]:
    a = api.get(f"/v1/jobs/{job}/assignment", params={"client": client}).json()
    t = {"a": np.random.default_rng(seed).standard_normal(24).astype(np.float32)}
    w = 1 + seed % 5
    r = realgw.upload(a["gateway_url"], job, rnd, client, tokens[client], t, w)
    assert r.status_code == 202, r.text
    return t, w


def _four_clients(api: Any, job: str, min_updates: int) -> dict[str, str]:
    """A job of 2 rounds of all its 4 clients, 600 s deadlines; the clients' tokens."""
    r = realgw.create_job(
        api, W0, job=job, rounds=2, goal=4, clients=4, overprovision=1.0,
        min_updates=min_updates, deadline_s=600.0,
    )  # fmt: skip
    tokens: dict[str, str] = r.json()["tokens"]
    return tokens


def test_a_failed_client_leaves_its_round_which_closes_with_the_others_at_once(
    api: Any, gateways: tuple[dict[str, str], str]
) -> None:
    urls, secret = gateways
    tokens = _four_clients(api, "leaves", min_updates=3)
    sent = [_upload(api, "leaves", 1, c, tokens, seed) for seed, c in enumerate(("c0", "c1"))]
    ans = _fail(api, "leaves", 1, "c3", tokens["c3"])  # its own token
    assert ans.status_code == 200, ans.text
    body = ans.json()
    assert (body["goal"], body["expected"], body["failed"]) == (3, 3, None)
    assert body["failures"] == {"c3": "RuntimeError: boom"}
    view = api.get("/v1/jobs/leaves").json()
    assert view["round"]["failures"] == {"c3": "RuntimeError: boom"}
    assert view["round"]["state"] == "open" and view["completed"] == 0  # c2 still comes
    sent.append(_upload(api, "leaves", 1, "c2", tokens, 7))
    view = _view(api, "leaves", lambda v: v["completed"] == 1)  # not the 600 s deadline
    h = view["history"][0]
    assert (h["state"], h["aggregated"], h["closing"], h["published"]) == (
        "closed",
        3,
        "goal",
        True,
    )
    assert h["failures"] == {"c3": "RuntimeError: boom"}
    m = httpx.get(f"{urls['n1']}/v1/jobs/leaves/model", headers=bearer(secret))
    want = sum(w * t["a"].astype(np.float64) for t, w in sent) / sum(w for _, w in sent)
    assert np.abs(load(m.content)["a"] - want).max() / np.abs(want).max() <= 1e-6
    # the client stays in the job: round 2 wants all four again, c3 among them
    view = _view(
        api, "leaves", lambda v: v["round"]["number"] == 2 and v["round"]["state"] == "open"
    )
    assert view["round"]["goal"] == 4 and view["round"]["failures"] == {}
    assert api.get("/v1/jobs/leaves/assignment", params={"client": "c3"}).status_code == 200


def test_a_failure_that_leaves_fewer_than_the_minimum_fails_the_job_at_once(
    api: Any, gateways: tuple[dict[str, str], str]
) -> None:
    urls, secret = gateways
    tokens = _four_clients(api, "toofew", min_updates=4)
    ans = _fail(api, "toofew", 1, "c1", tokens["c1"])
    assert ans.status_code == 200, ans.text
    reason = (
        "round 1: 1 selected client(s) failed (c1); at most 3 of its minimum 4 update(s) can arrive"
    )
    assert ans.json()["failed"] == reason
    view = api.get("/v1/jobs/toofew").json()
    assert view["failed"] == reason and view["round"]["state"] == "failed"
    assert view["history"][-1]["failures"] == {"c1": "RuntimeError: boom"}
    for url in urls.values():  # no gateway waits on the round
        assert httpx.get(f"{url}/v1/jobs/toofew", headers=bearer(secret)).status_code == 404
    a = api.get("/v1/jobs/toofew/assignment", params={"client": "c0"})
    assert a.status_code == 409 and a.json()["error"] == "job_failed"


def test_bad_failure_reports_get_a_clear_4xx_and_change_nothing(api: Any) -> None:
    r = realgw.create_job(
        api, W0, job="badfail", rounds=1, goal=2, clients=2, overprovision=1.0, deadline_s=600.0
    )
    tokens = r.json()["tokens"]
    path = "/v1/jobs/badfail/rounds/1/failures"

    def post(client: str, token: str, **kw: Any) -> tuple[int, str]:
        resp = api.post(path, params={"client": client}, headers=bearer(token), **kw)
        return resp.status_code, resp.json()["error"]

    assert post("c0", tokens["c0"], content=b"not json") == (422, "invalid_input")
    assert post("c0", tokens["c0"], json={"client": "c0", "error": 3}) == (422, "invalid_input")
    assert post("c0", tokens["c0"], json={"client": "c0", "error": "x" * 2001}) == (
        422,
        "invalid_input",
    )
    big = b'{"client": "c0", "error": "' + b"x" * 9000 + b'"}'
    assert post("c0", tokens["c0"], content=big) == (413, "body_too_large")
    # one client may not report another's failure, nor with another client's token
    assert post("c0", tokens["c0"], json={"client": "c1", "error": "x"}) == (403, "forbidden")
    assert post("c1", tokens["c0"], json={"client": "c1", "error": "x"}) == (401, "unauthorized")
    # the admin may report for a client, of the open round only, of a client in it
    admin = api.headers["authorization"].split()[1]
    assert post("zz", admin, json={"client": "zz", "error": "x"}) == (409, "client_not_selected")
    bad_round = api.post(
        "/v1/jobs/badfail/rounds/2/failures",
        headers=bearer(admin),
        json={"client": "c0", "error": "x"},
    )
    assert (bad_round.status_code, bad_round.json()["error"]) == (409, "round_state")
    missing = api.post(
        "/v1/jobs/nojob/rounds/1/failures",
        headers=bearer(admin),
        json={"client": "c0", "error": "x"},
    )
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown_job")
    view = api.get("/v1/jobs/badfail").json()
    assert view["round"]["failures"] == {} and view["round"]["goal"] == 2 and not view["failed"]


def test_once_the_job_is_done_the_assignment_sends_a_client_to_the_final_model(
    api: Any, gateways: tuple[dict[str, str], str]
) -> None:
    """Issue 42: after the last round, a client asking where to go heard 409
    ``client_not_selected``; now it hears the root node, whose model is the final one."""
    urls = gateways[0]
    r = realgw.create_job(api, W0, job="over", rounds=1, goal=2, clients=2, overprovision=1.0)
    tokens = r.json()["tokens"]
    sent = [_upload(api, "over", 1, c, tokens, 20 + i) for i, c in enumerate(("c0", "c1"))]
    view = _view(api, "over", lambda v: v["done"])
    a = api.get("/v1/jobs/over/assignment", params={"client": "c1"}, headers=bearer(tokens["c1"]))
    assert a.status_code == 200, a.text
    assert a.json() == {
        "job": "over",
        "round": 1,
        "client": "c1",
        "node": view["root"],
        "gateway_url": urls[view["root"]],
        "tls_name": None,  # a static URL: verified by its host
        "resend": 0,
        "done": True,
    }
    m = httpx.get(f"{a.json()['gateway_url']}/v1/jobs/over/model", headers=bearer(tokens["c1"]))
    want = sum(w * t["a"].astype(np.float64) for t, w in sent) / sum(w for _, w in sent)
    assert m.headers["x-model-version"] == "1"
    assert np.abs(load(m.content)["a"] - want).max() / np.abs(want).max() <= 1e-6
