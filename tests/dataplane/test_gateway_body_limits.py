"""Request bodies on a real gateway (in-process) with real Redis: no body byte is read before the
request is authenticated and routed, JSON bodies are bounded, the job-creation body streams into
shared memory, and bodies in flight share one per-node budget (503 + Retry-After past it)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest

from core import wire
from gateway.asgi import STEP
from gateway.settings import GatewaySettings
from tests.dataplane.gwutil import GatewayThread, tiny_bytes
from tests.dataplane.rawhttp import closed_by_peer, read_answer, send_head
from tests.polling import wait_until

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1", "c2", "c3"]
GIB = 1 << 30


def create(gw: GatewayThread, name: str = "j1", body: bytes | None = None) -> dict[str, str]:
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": name, "rounds": 2, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=tiny_bytes(0) if body is None else body,
        headers=admin(gw),
        timeout=60,
    )
    assert r.status_code == 201, r.text
    gw.gw.budget.peak = 0  # what follows starts from a clean high-water mark
    return dict(r.json()["tokens"])


def admin(gw: GatewayThread) -> dict[str, str]:
    return {"Authorization": f"Bearer {gw.gw.secret}"}


def upload_head(tokens: dict[str, str], client: str, token_of: str | None = None) -> dict[str, str]:
    head = {"X-Client-Id": client, "X-Sample-Count": "1"}
    if token_of is not None:
        head["Authorization"] = f"Bearer {tokens[token_of]}"
    return head


#: every route that needs a credential: (method, target, extra headers)
GUARDED = [
    ("POST", "/v1/jobs?job=new-1&rounds=1&goal=1&clients=a", {}),
    ("DELETE", "/v1/jobs/j1", {}),
    ("PUT", "/v1/jobs/j1/rounds/1/plan", {}),
    ("POST", "/v1/jobs/j1/rounds/1/close", {}),
    ("GET", "/v1/jobs/j1/model", {}),
    ("POST", "/v1/jobs/j1/rounds/1/updates", {"X-Client-Id": "c0", "X-Sample-Count": "1"}),
    ("POST", "/v1/internal/jobs/j1/rounds/1/partials?slot=0", {}),
]


@pytest.mark.parametrize(("method", "target", "extra"), GUARDED, ids=[g[1] for g in GUARDED])
@pytest.mark.parametrize("credential", ["none", "wrong", "another scope"])
def test_a_request_without_a_good_credential_is_answered_401_from_its_head_alone(
    make_gw, method: str, target: str, extra: dict[str, str], credential: str
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    tokens = create(gw)
    headers = dict(extra)
    if credential == "wrong":
        headers["Authorization"] = "Bearer " + "0" * 64
    elif credential == "another scope":
        # admin routes: a client's token; the model: a token of another job; uploads: c1's as c0
        tok = {
            "/v1/jobs/j1/model": create(gw, "j2")["c0"],
            "/v1/jobs/j1/rounds/1/updates": tokens["c1"],
        }.get(target, tokens["c0"])
        headers["Authorization"] = f"Bearer {tok}"
    s = send_head(gw.gw.port, method, target, headers, content_length=1000)  # no body byte sent
    try:
        a = read_answer(s, timeout=5)
        assert a.status == 401, a.body
        assert a.headers["content-type"] == "application/json"
        assert a.json()["error"] == "unauthorized" and a.json()["detail"]
        assert gw.gw.budget.used == 0 and gw.gw.budget.peak == 0  # nothing taken for the body
        # the unread body is read away afterwards and the connection serves the next request
        s.sendall(b"\0" * 1000 + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(s).status == 200
    finally:
        s.close()
    assert "new-1" not in gw.gw.jobs and "j1" in gw.gw.jobs


def test_a_refused_head_announcing_a_huge_body_gets_no_100_continue_and_is_closed(
    make_gw,
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    create(gw)
    for method, target, extra in GUARDED:
        s = send_head(
            gw.gw.port, method, target, {**extra, "Expect": "100-continue"}, content_length=GIB
        )
        try:
            a = read_answer(s, timeout=5)
            assert (a.status, a.informational) == (401, []), (target, a)
            assert a.headers.get("connection") == "close"
            assert closed_by_peer(s, timeout=5)
        finally:
            s.close()
    assert gw.gw.budget.peak == 0


def test_an_accepted_request_gets_100_continue_and_its_body_is_read(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    create(gw)
    body = b'{"received": {"n1": -1}}'
    s = send_head(
        gw.gw.port,
        "POST",
        "/v1/jobs/j1/rounds/1/close",
        {**admin(gw), "Expect": "100-continue"},
        content_length=len(body),
    )
    try:
        s.settimeout(5)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        a = read_answer(s)
        assert a.status == 422 and a.json()["error"] == "bad_close"  # it was read and parsed
    finally:
        s.close()


@pytest.mark.parametrize(
    ("method", "target"),
    [("PUT", "/v1/jobs/j1/rounds/1/plan"), ("POST", "/v1/jobs/j1/rounds/1/close")],
)
def test_an_oversize_json_body_is_413_json_before_a_byte_of_it_is_read(
    make_gw, method: str, target: str
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    create(gw)
    bound = gw.settings.max_json_body
    assert bound == 1 << 20
    for announced in (bound + 1, GIB):
        s = send_head(gw.gw.port, method, target, admin(gw), content_length=announced)
        try:
            a = read_answer(s, timeout=5)
            assert a.status == 413 and a.json()["error"] == "body_too_large", a.body
            assert str(bound) in a.json()["detail"]
        finally:
            s.close()
    assert gw.gw.budget.peak == 0
    # a client that sends the whole body first (httpx does) reads the same answer
    r = httpx.request(method, gw.url + target, content=b" " * (2 * bound), headers=admin(gw))
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    # within the bound the body is read, held against the budget, and given back
    r = httpx.request(method, gw.url + target, content=b"[" * 1000, headers=admin(gw))
    assert r.status_code == 400 and r.json()["error"] == "bad_json"
    assert gw.gw.budget.used == 0 and gw.gw.budget.peak == 1000
    assert httpx.get(gw.url + "/v1/jobs/j1", headers=admin(gw)).json()["round"] == 1


def test_unknown_routes_and_oversize_job_bodies_are_answered_from_the_head(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    for method, target, headers, status in [
        ("POST", "/v1/nothing-here", {}, 404),
        ("PUT", "/v1/jobs", admin(gw), 405),
        ("POST", "/v1/jobs?job=big&rounds=1&goal=1&clients=a", admin(gw), 413),
        ("POST", "/v1/jobs?job=Bad_Name&rounds=1&goal=1&clients=a", admin(gw), 400),
        ("POST", "/v1/jobs?job=x&rounds=1&goal=2&clients=a", admin(gw), 400),
    ]:
        s = send_head(gw.gw.port, method, target, headers, content_length=GIB + 1)
        try:
            a = read_answer(s, timeout=5)
            assert a.status == status, (target, a)
            assert a.headers["content-type"] == "application/json"
            assert closed_by_peer(s, timeout=5)
        finally:
            s.close()
    assert gw.gw.budget.peak == 0 and not gw.gw.jobs


def _memfds(size: int) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if (
                target.startswith("/memfd:fedfaas-job-body")
                and os.stat(f"/proc/self/fd/{fd}").st_size == size
            ):
                found.append(target)
        except OSError:
            continue
    return found


def test_the_job_body_streams_into_shared_memory_as_it_arrives(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(pool=1)
    rng = np.random.default_rng(3)
    body = wire.encode_tensors({"w": rng.standard_normal((3 << 20,)).astype(np.float32)})
    half = len(body) // 2
    target = f"/v1/jobs?job=big&rounds=1&goal=1&clients={','.join(CLIENTS)}"
    s = send_head(gw.gw.port, "POST", target, admin(gw), content_length=len(body), body=body[:half])
    try:
        # the body lands in a memfd of exactly its size; the budget is taken as bytes arrive
        wait_until(lambda: _memfds(len(body)) and gw.gw.budget.used >= half, 5)
        assert half <= gw.gw.budget.used <= half + STEP < len(body)
        s.sendall(body[half:])
        a = read_answer(s, timeout=30)
        assert a.status == 201, a.body
    finally:
        s.close()
    wait_until(lambda: not _memfds(len(body)), 5)
    assert gw.gw.budget.used == 0
    tok = a.json()["tokens"]["c0"]
    got = httpx.get(gw.url + "/v1/jobs/big/model", headers={"Authorization": f"Bearer {tok}"})
    assert got.content == body


def test_past_the_budget_an_upload_is_503_with_retry_after_and_allocates_nothing(make_gw) -> None:  # type: ignore[no-untyped-def]
    nbytes = wire.ModelSpec.from_safetensors(tiny_bytes(0)).object_nbytes
    gw = make_gw(max_inflight_bytes=nbytes + nbytes // 2, max_inflight=0)
    # a job of two nodes too: its slots on n2 send their partials here (n2 need not run)
    two = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j2", "rounds": 1, "goal": 2, "clients": "d0,d1", "nodes": "n1,n2"},
        content=tiny_bytes(0),
        headers=admin(gw),
    )
    assert two.status_code == 201, two.text
    remote = next(x["id"] for x in two.json()["plan"]["slots"] if x["node"] == "n2")
    tokens = create(gw)
    job = gw.gw.jobs["j1"]
    url = gw.url + "/v1/jobs/j1/rounds/1/updates"
    data = tiny_bytes(1)
    # c0's upload is in flight (part of its body sent): it holds one object of the budget
    s = send_head(
        gw.gw.port,
        "POST",
        "/v1/jobs/j1/rounds/1/updates",
        upload_head(tokens, "c0", "c0"),
        content_length=len(data),
        body=data[:40],
    )
    try:
        wait_until(lambda: job.inflight == {"c0"}, 5)
        assert gw.gw.budget.used == nbytes
        stats, keys = job.ns.stats(), job.ns.keys()
        r = httpx.post(url, content=tiny_bytes(2), headers=upload_head(tokens, "c1", "c1"))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == "memory_budget" and "max_inflight_bytes" in r.json()["detail"]
        assert job.ns.stats() == stats and job.ns.keys() == keys  # nothing allocated
        assert job.inflight == {"c0"} and gw.gw.budget.used == nbytes
        # a JSON body past what is left: 503 too, before a byte of it is read
        r = httpx.post(
            gw.url + "/v1/jobs/j1/rounds/1/close", content=b"{}" * nbytes, headers=admin(gw)
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == "memory_budget"
        # so does a partial from another node's gateway
        r = httpx.post(
            gw.url + "/v1/internal/jobs/j2/rounds/1/partials",
            params={"slot": remote},
            content=b"\0" * nbytes,
            headers=admin(gw),
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert job.ns.stats() == stats and gw.gw.budget.used == nbytes
        # c0 finishes and gives its share back: c1's retry goes through
        s.sendall(data[40:])
        assert read_answer(s).status == 202
    finally:
        s.close()
    assert gw.gw.budget.used == 0
    r = httpx.post(url, content=tiny_bytes(2), headers=upload_head(tokens, "c1", "c1"))
    assert r.status_code == 202, r.text
    assert gw.gw.budget.used == 0 and gw.gw.budget.peak <= gw.settings.max_inflight_bytes
    metrics = httpx.get(gw.url + "/metrics", headers=admin(gw)).text
    assert "fedfaas_gateway_body_budget_refusals_total 3.0" in metrics
    assert "fedfaas_gateway_body_bytes_held 0.0" in metrics


def test_a_job_body_past_the_budget_is_refused_503_as_it_arrives(make_gw) -> None:  # type: ignore[no-untyped-def]
    budget = 8 << 20
    gw = make_gw(max_inflight_bytes=budget, pool=1)
    big = wire.encode_tensors({"w": np.ones((4 << 20,), np.float32)})  # 16 MiB
    target = {"job": "big", "rounds": 1, "goal": 1, "clients": "a"}
    r = httpx.post(gw.url + "/v1/jobs", params=target, content=big, headers=admin(gw))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"] == "memory_budget" and "big" in r.json()["detail"]
    assert "big" not in gw.gw.jobs and not _memfds(len(big))
    assert gw.gw.budget.used == 0 and gw.gw.budget.peak <= budget
    small = wire.encode_tensors({"w": np.ones((1 << 20,), np.float32)})  # 4 MiB fits
    r = httpx.post(gw.url + "/v1/jobs", params=target, content=small, headers=admin(gw))
    assert r.status_code == 201, r.text


def test_the_budget_and_the_json_bound_are_settings_with_flags(tmp_path: Path) -> None:
    s = GatewaySettings(state_dir=tmp_path, max_inflight_bytes=123456, max_json_body=4096)
    argv = s.to_argv()
    assert argv[argv.index("--max-inflight-bytes") + 1] == "123456"
    assert argv[argv.index("--max-json-body") + 1] == "4096"
    back = GatewaySettings.from_argv(argv[3:])[0]
    assert (back.max_inflight_bytes, back.max_json_body) == (123456, 4096)
    defaults = GatewaySettings(state_dir=tmp_path)
    assert defaults.max_json_body == 1 << 20 and defaults.max_inflight_bytes == 4 << 30


def test_a_partial_this_node_cannot_take_is_refused_from_its_head_with_what_is_wrong(
    make_gw,
) -> None:  # type: ignore[no-untyped-def]
    """A partial for a slot that is not another node's in the round's plan here (its sender
    runs another plan), for a round not open here, or of a job not here: 409 ``unknown_slot``
    / ``stale_round``, 404 ``unknown_job``, each before a byte of the body is read."""
    gw = make_gw()
    create(gw)
    job = gw.gw.jobs["j1"]
    nbytes = job.spec.object_nbytes
    keys = job.ns.keys()
    for target, slot, status, code in [
        ("j1/rounds/1", 1, 409, "unknown_slot"),  # the top, on this node
        ("j1/rounds/1", 999, 409, "unknown_slot"),
        ("j1/rounds/2", 1, 409, "stale_round"),
        ("nope/rounds/1", 1, 404, "unknown_job"),
    ]:
        r = httpx.post(
            f"{gw.url}/v1/internal/jobs/{target}/partials",
            params={"slot": slot},
            content=b"\0" * nbytes,
            headers=admin(gw),
        )
        assert (r.status_code, r.json()["error"]) == (status, code), r.text
        assert r.json()["detail"]
    assert job.ns.keys() == keys and gw.gw.budget.used == 0
