"""FL client SDK (client.sdk): error mapping, ETags, streaming uploads.

Unit tests use an httpx mock transport for the pure request/answer logic; the integration
tests run the SDK against a real node gateway (``python -m gateway``) with real Redis.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client.model import make_model, model_to_bytes
from client.sdk import (
    Conflict,
    FLClient,
    GatewayUnavailable,
    InvalidRequest,
    JobNotFound,
    NotFound,
    StaleRound,
    Unauthorized,
    UpdateRejected,
    create_job,
)
from core.services import free_port
from tests.dataplane.gwproc import gateway_process

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ unit (mocked)
def _mock(handler) -> httpx.MockTransport:  # type: ignore[no-untyped-def]
    return httpx.MockTransport(handler)


def test_a_409_becomes_stale_round_carrying_the_servers_json_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "stale_round", "detail": "open round is 3"})

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    with pytest.raises(StaleRound) as ei:
        c.upload(2, b"x" * 10, num_samples=5)
    assert ei.value.status == 409 and ei.value.error == "stale_round"
    assert ei.value.detail == "open round is 3"
    assert isinstance(ei.value, UpdateRejected)


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (401, "e", Unauthorized),
        (403, "e", Unauthorized),
        (404, "e", NotFound),
        (404, "unknown_job", JobNotFound),
        (409, "e", Conflict),
        (400, "e", InvalidRequest),
        (413, "e", UpdateRejected),
    ],
)
def test_a_4xx_maps_to_its_codes_class_else_to_its_statuses(
    status: int, code: str, cls: type[UpdateRejected]
) -> None:
    c = FLClient(
        "http://gw",
        "job",
        "c1",
        "tok",
        transport=_mock(lambda r: httpx.Response(status, json={"error": code, "detail": "d"})),
    )
    with pytest.raises(cls) as ei:
        c.status()
    assert type(ei.value) is cls and isinstance(ei.value, UpdateRejected)
    assert (ei.value.status, ei.value.error, ei.value.detail) == (status, code, "d")


def test_a_4xx_without_json_still_gives_a_readable_error() -> None:
    c = FLClient(
        "http://gw",
        "job",
        "c1",
        "tok",
        transport=_mock(lambda r: httpx.Response(400, text="plain words")),
    )
    with pytest.raises(UpdateRejected) as ei:
        c.status()
    assert ei.value.error == "http_400" and "plain words" in ei.value.detail


def test_5xx_and_refused_connections_are_gateway_unavailable() -> None:
    c = FLClient(
        "http://gw", "job", "c1", "tok", transport=_mock(lambda r: httpx.Response(503, text="busy"))
    )
    with pytest.raises(GatewayUnavailable):
        c.status()
    dead = FLClient(f"http://127.0.0.1:{free_port()}", "job", "c1", "tok", timeout=2)
    with pytest.raises(GatewayUnavailable):
        dead.fetch_model()


def test_upload_streams_the_exact_bytes_with_content_length_and_headers() -> None:
    seen: dict[str, object] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen.update(path=req.url.path, headers=dict(req.headers), body=req.read())
        return httpx.Response(202, json={"key": "ab" * 16, "round": 4, "client": "c1"})

    data = os.urandom(3 * (1 << 20) + 17)
    c = FLClient("http://gw/", "job", "c1", "tok", transport=_mock(handler))
    receipt = c.upload(4, data, num_samples=123)
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert seen["path"] == "/v1/jobs/job/rounds/4/updates"
    assert seen["body"] == data
    assert headers["content-length"] == str(len(data))
    assert "transfer-encoding" not in headers
    assert headers["authorization"] == "Bearer tok"
    assert headers["x-client-id"] == "c1" and headers["x-sample-count"] == "123"
    assert receipt.key == "ab" * 16 and receipt.round == 4


def test_round_not_open_yet_is_retried_but_other_409s_are_final() -> None:
    calls = {"n": 0}

    def handler(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            return httpx.Response(409, json={"error": "round_not_open", "detail": "soon"})
        return httpx.Response(202, json={"key": "k", "round": 1, "client": "c1"})

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    assert c.upload(1, b"abc", 1).key == "k" and calls["n"] == 3
    calls["n"] = -100
    with pytest.raises(StaleRound):
        c.upload(1, b"abc", 1, not_open_wait=0.2)


def test_fetch_model_sends_if_none_match_and_reuses_the_cache_on_304() -> None:
    sent: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(req.headers.get("if-none-match"))
        if req.headers.get("if-none-match") == '"v3"':
            return httpx.Response(304, headers={"ETag": '"v3"', "X-Model-Version": "3"})
        return httpx.Response(
            200, content=b"weights", headers={"ETag": '"v3"', "X-Model-Version": "3"}
        )

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    first, second = c.fetch_model(), c.fetch_model()
    assert sent == [None, '"v3"']
    assert first.changed and not second.changed
    assert second.data == b"weights" and second.version == 3


def test_status_and_model_reads_send_the_clients_token() -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.path, req.headers.get("authorization")))
        if req.url.path.endswith("/model"):
            return httpx.Response(200, content=b"w", headers={"X-Model-Version": "0"})
        return httpx.Response(200, json={"version": 0})

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    c.status()
    c.fetch_model()
    assert seen == [("/v1/jobs/job", "Bearer tok"), ("/v1/jobs/job/model", "Bearer tok")]


# ------------------------------------------------------------------------------ real gateway
@pytest.fixture()
def gateway(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, str]]:
    """One real node gateway subprocess with one ``aggregator`` replica (two endpoints);
    yields (url, admin secret)."""
    with gateway_process(tmp_path, redis_url) as (gw, admin):
        yield gw.url, admin


@pytest.mark.integration
def test_sdk_against_the_real_gateway_reports_each_rejection_precisely(
    gateway: tuple[str, str],
) -> None:
    url, admin = gateway
    weights = model_to_bytes(make_model(0))
    with pytest.raises(Unauthorized):
        create_job(url, "wrong", "sdk", weights, rounds=2, goal=2, clients=["c0", "c1"])
    job = create_job(url, admin, "sdk", weights, rounds=2, goal=2, clients=["c0", "c1"])
    assert job.round == 1 and job.version == 0
    assert sorted(job.tokens) == ["c0", "c1"] and job.tokens["c0"] != job.tokens["c1"]

    c0 = FLClient(url, "sdk", "c0", job.tokens["c0"])
    model = c0.fetch_model()
    assert model.version == 0 and model.data == weights and model.changed
    assert not c0.fetch_model().changed  # 304 on the same ETag

    with pytest.raises(Unauthorized):
        FLClient(url, "sdk", "c0", job.tokens["c1"]).upload(1, weights, 10)
    with pytest.raises(StaleRound) as future:
        c0.upload(2, weights, 10, not_open_wait=0)
    assert future.value.error == "future_round"
    with pytest.raises(UpdateRejected) as bad:
        c0.upload(1, b"not safetensors at all", 10)
    assert 400 <= bad.value.status < 500 and bad.value.detail
    with pytest.raises(JobNotFound):  # the admin learns that no such job exists
        FLClient(url, "nope", "c0", admin).status()
    with pytest.raises(Unauthorized):  # a client token is good for its own job only
        FLClient(url, "nope", "c0", job.tokens["c0"]).status()

    assert c0.upload(1, weights, 10).round == 1
    with pytest.raises(StaleRound) as dup:
        c0.upload(1, weights, 10)
    assert dup.value.error == "duplicate_client"
    assert c0.status()["received"] == 1

    c1 = FLClient(url, "sdk", "c1", job.tokens["c1"])
    c1.upload(1, weights, 30)
    new = c1.wait_for_version(1, timeout=60)
    assert new.version == 1 and new.changed
    assert json.loads(new.data[8 : 8 + int.from_bytes(new.data[:8], "little")])


# ------------------------------------------------------- jobs on the control plane, FLStore queries
def test_with_metadata_adds_to_the_safetensors_header_and_keeps_the_tensors() -> None:
    import numpy as np
    from safetensors.numpy import load, save

    from client.sdk import with_metadata

    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    raw = save(tensors, metadata={"format": "np"})
    out = with_metadata(raw, {"fedfaas.evaluator": '{"kind":"digits-softmax"}'})
    n = int.from_bytes(out[:8], "little")
    assert n % 8 == 0
    assert json.loads(out[8 : 8 + n])["__metadata__"] == {
        "format": "np",
        "fedfaas.evaluator": '{"kind":"digits-softmax"}',
    }
    got = load(out)
    assert all(np.array_equal(got[k], tensors[k]) for k in tensors)


def test_submit_job_posts_the_job_to_the_control_plane_with_its_evaluator() -> None:
    import base64

    from client.sdk import submit_job

    sent: dict[str, object] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        sent.update(
            url=str(req.url), body=json.loads(req.content), auth=req.headers["authorization"]
        )
        return httpx.Response(201, json={"job": "j", "round": {"number": 1, "state": "open"}})

    weights = model_to_bytes(make_model(0, "softmax"))
    view = submit_job(
        "http://cp:8070/",
        "j",
        weights,
        rounds=3,
        clients=["a", "b"],
        admin_token="adm",
        evaluator={"kind": "digits-softmax", "split_seed": 0},
        transport=httpx.MockTransport(handler),
    )
    assert view["round"]["number"] == 1 and sent["url"] == "http://cp:8070/v1/jobs"
    assert sent["auth"] == "Bearer adm"
    body = sent["body"]
    assert isinstance(body, dict)
    assert {k: body[k] for k in ("job", "rounds", "goal", "clients", "policy")} == {
        "job": "j",
        "rounds": 3,
        "goal": 2,
        "clients": ["a", "b"],
        "policy": "leastconn",
    }
    # the deadline policy: the SDK's defaults are the control plane's own
    from control_plane.api import JobIn

    for k in ("deadline_s", "min_updates", "on_shortfall", "max_reopens"):
        assert body[k] == JobIn.model_fields[k].default, k
    blob = base64.b64decode(body["weights_b64"])
    header = json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")])
    assert json.loads(header["__metadata__"]["fedfaas.evaluator"]) == {
        "kind": "digits-softmax",
        "split_seed": 0,
    }


def test_submit_job_refused_by_the_control_plane_raises_its_error() -> None:
    from client.sdk import submit_job

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": "invalid_request", "detail": "job: bad"})

    with pytest.raises(UpdateRejected) as err:
        submit_job(
            "http://cp",
            "J!",
            b"",
            rounds=1,
            clients=["a"],
            admin_token="t",
            transport=_mock(handler),
        )
    assert err.value.error == "invalid_request" and err.value.detail == "job: bad"


def test_flstore_query_waits_for_the_round_to_be_ingested_then_returns_the_record() -> None:
    from client.sdk import QueryFailed, flstore_query

    calls: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(json.loads(req.content))
        assert req.url.params["wait"] == "true"
        assert req.headers["authorization"] == "Bearer ana"
        if len(calls) < 3:
            return httpx.Response(404, json={"error": "round_not_written", "detail": "not yet"})
        return httpx.Response(200, json={"status": "done", "result": {"flagged": ["c3"]}})

    rec = flstore_query(
        "http://tracker",
        "multi-krum",
        "j",
        rounds=[2],
        params={"f": 1},
        token="ana",
        transport=_mock(handler),
    )
    assert rec["result"]["flagged"] == ["c3"] and len(calls) == 3
    assert calls[0] == {"workload": "multi-krum", "job": "j", "params": {"f": 1}, "rounds": [2]}

    def refuse(req: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": "invalid_params", "detail": "k: too big"})

    with pytest.raises(QueryFailed) as err:
        flstore_query(
            "http://tracker", "oort", "j", params={"k": 99}, token="t", transport=_mock(refuse)
        )
    assert (err.value.status, err.value.error) == (422, "invalid_params")


def test_flstore_query_asks_again_while_the_tracker_restarts_then_gives_up() -> None:
    """A broken connection, a refused one and a 503 are asked again (a query only reads); a
    tracker that stays away past ``wait`` is an ``unreachable`` QueryFailed."""
    from client.sdk import QueryFailed, flstore_query

    calls: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("peer closed connection", request=req)
        if len(calls) == 2:
            raise httpx.ConnectError("connection refused", request=req)
        if len(calls) == 3:
            return httpx.Response(503, json={"error": "engine_unavailable", "detail": "later"})
        return httpx.Response(200, json={"status": "done", "result": {"k": 2}})

    rec = flstore_query("http://tracker", "kmeans", "j", token="t", transport=_mock(handler))
    assert rec["result"] == {"k": 2} and len(calls) == 4

    def away(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    t0 = time.monotonic()
    with pytest.raises(QueryFailed) as err:
        flstore_query("http://tracker", "kmeans", "j", token="t", wait=1, transport=_mock(away))
    assert err.value.error == "unreachable" and 1.0 <= time.monotonic() - t0 < 5.0


def test_an_upload_rides_out_a_restarting_gateway_and_a_landed_upload_is_resent() -> None:
    """The first attempt breaks (the gateway died after sealing it), the next is refused (it
    is starting), the third hears 409 duplicate_client: the update landed once, receipt
    ``resent``. Without a break, a duplicate is the caller's error (StaleRound)."""
    calls: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(len(req.read()))
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("peer closed connection", request=req)
        if len(calls) == 2:
            raise httpx.ConnectError("connection refused", request=req)
        return httpx.Response(409, json={"error": "duplicate_client", "detail": "already sent"})

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    receipt = c.upload(2, b"x" * 1000, 5)
    assert receipt.resent and receipt.round == 2 and receipt.key == ""
    assert calls == [1000, 1000, 1000], "each attempt streamed the whole body again"

    calls.clear()
    c2 = FLClient(
        "http://gw",
        "job",
        "c1",
        "tok",
        transport=_mock(lambda r: httpx.Response(409, json={"error": "duplicate_client"})),
    )
    with pytest.raises(StaleRound):
        c2.upload(2, b"x", 5)


def test_an_upload_gives_up_after_unavailable_wait() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    c = FLClient("http://gw", "job", "c1", "tok", transport=_mock(handler))
    with pytest.raises(GatewayUnavailable):
        c.upload(1, b"x", 1, unavailable_wait=0.3)
    with pytest.raises(GatewayUnavailable):
        c.upload(1, b"x", 1, unavailable_wait=0)
