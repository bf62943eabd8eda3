"""The job's handle (client.job.Job) against a scripted control plane (httpx's mock transport):
what it asks, with which token, and what it makes of the answers. The handle on a real
platform is in test_platform_job.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load, save

from client.errors import ClientNotSelected, JobFailed, StaleRound
from client.job import Job
from client.sdk import submit_job

CP, GW0, GW1, TRACKER = "http://cp", "http://gw0", "http://gw1", "http://tracker"


class FakePlatform:
    """Answers like the control plane, two gateways and the tracker, from ``self.view``."""

    def __init__(self) -> None:
        self.view: dict[str, Any] = {
            "job": "j",
            "round": {"number": 1, "state": "open"},
            "done": False,
            "failed": None,
            "root": "node1",
            "history": [],
        }
        self.selected = {"c0", "c1"}
        self.seen: list[httpx.Request] = []
        self.views = 0  # views answered; ``on_view`` may move the job on
        self.on_view: Any = None
        self.model = save({"w": np.arange(4, dtype=np.float32)})

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.seen.append(req)
        host, path = f"http://{req.url.host}", req.url.path
        if host == CP and path == "/v1/jobs" and req.method == "POST":
            body = {"job": "j", "round": self.view["round"], "tokens": {"c0": "t0"}}
            return httpx.Response(201, json={**body, "enrollment_token": "enr"})
        if host == CP and path == "/v1/jobs/j/clients":
            ids = json.loads(req.content)["clients"]
            return httpx.Response(201, json={"tokens": {c: f"t-{c}" for c in ids}})
        if host == CP and path == "/v1/jobs/j":
            self.views += 1
            if self.on_view is not None:
                self.on_view(self)
            return httpx.Response(200, json=self.view)
        if host == CP and path == "/v1/jobs/j/assignment":
            client = req.url.params["client"]
            if self.view["done"]:
                a = {"round": 2, "node": "node1", "gateway_url": GW1, "done": True}
                return httpx.Response(200, json={"job": "j", "client": client, "resend": 0, **a})
            if self.view["round"]["state"] != "open" or client not in self.selected:
                return httpx.Response(409, json={"error": "client_not_selected", "detail": "no"})
            body = {"job": "j", "round": self.view["round"]["number"], "client": client}
            return httpx.Response(200, json={**body, "node": "node0", "gateway_url": GW0})
        if host == CP and path.startswith("/v1/jobs/j/rounds/") and path.endswith("/failures"):
            return httpx.Response(200, json={"goal": 1, "failures": json.loads(req.content)})
        if host == CP and path == "/v1/nodes":
            nodes = [{"name": "node0", "url": GW0, "healthy": True}]
            return httpx.Response(200, json={"nodes": [*nodes, {"name": "node1", "url": GW1}]})
        if host in (GW0, GW1) and path == "/v1/jobs/j/model":
            return httpx.Response(200, content=self.model, headers={"X-Model-Version": "2"})
        if host == GW0 and path == "/v1/jobs/j/rounds/1/updates":
            req.read()
            return httpx.Response(202, json={"key": "k", "round": 1, "client": "c0"})
        if host == TRACKER and path == "/v1/queries":
            return httpx.Response(200, json={"result": {"values": {"c0": 0.5}}})
        return httpx.Response(404, json={"error": "not_found", "detail": f"{req.method} {path}"})

    def auth_of(self, path: str) -> list[str]:
        return [r.headers["authorization"] for r in self.seen if r.url.path == path]


def _job(fake: FakePlatform, **kw: Any) -> Job:
    return submit_job(
        CP,
        "j",
        save({"w": np.zeros(4, np.float32)}),
        rounds=2,
        goal=2,
        admin_token="adm",
        transport=httpx.MockTransport(fake),
        **kw,
    )


def test_submit_job_gives_a_handle_that_reads_as_the_creation_answer() -> None:
    fake = FakePlatform()
    job = _job(fake)
    assert isinstance(job, Job) and isinstance(job, Mapping) and job.name == "j"
    assert job["enrollment_token"] == "enr" and job["tokens"] == {"c0": "t0"}
    assert job["round"]["number"] == 1 and dict(job)["job"] == "j" and "tokens" in job
    assert job.tokens == {"c0": "t0"}
    assert job.enroll(["c1", "c2"]) == {"c1": "t-c1", "c2": "t-c2"}
    assert fake.auth_of("/v1/jobs/j/clients") == ["Bearer enr"]  # the enrollment token
    assert job.tokens == {"c0": "t0", "c1": "t-c1", "c2": "t-c2"}  # kept by the handle


def test_assignment_waits_for_its_round_and_asks_with_the_clients_own_token() -> None:
    fake = FakePlatform()
    job = _job(fake)

    def move_on(f: FakePlatform) -> None:  # round 1 ends at the 3rd view; round 2 opens
        if f.views == 3:
            f.view["round"] = {"number": 2, "state": "open"}

    fake.on_view = move_on
    a = job.assignment("c0", round=2)
    assert (a.round, a.node, a.gateway_url, a.done) == (2, "node0", GW0, False)
    assert fake.views == 3 and fake.auth_of("/v1/jobs/j/assignment") == ["Bearer t0"]
    with pytest.raises(StaleRound) as over:
        job.assignment("c0", round=1)
    assert over.value.error == "stale_round" and "round 1" in over.value.detail
    with pytest.raises(ClientNotSelected):  # open without it, asked twice to be sure
        job.assignment("c9", round=2)
    assert fake.auth_of("/v1/jobs/j/assignment")[-1] == "Bearer adm"  # no token of its own
    fake.view.update(done=True)
    final = job.assignment("c0")
    assert (final.done, final.gateway_url, final.round) == (True, GW1, 2)


def test_wait_returns_the_rounds_record_or_the_final_view_and_raises_job_failed() -> None:
    fake = FakePlatform()
    job = _job(fake)

    def close_round_1(f: FakePlatform) -> None:
        if f.views == 2:
            f.view["history"] = [{"round": 1, "state": "closed", "aggregated": 2}]
        if f.views == 4:
            f.view["done"] = True

    fake.on_view = close_round_1
    assert job.wait(1) == {"round": 1, "state": "closed", "aggregated": 2}
    assert job.wait()["done"] is True
    assert job.history() == [{"round": 1, "state": "closed", "aggregated": 2}]
    fake.on_view = None
    fake.view.update(done=False, failed="round 2: 0 of its minimum 1 update(s)")
    with pytest.raises(JobFailed) as failed:
        job.wait()
    assert (failed.value.job, failed.value.reason) == ("j", "round 2: 0 of its minimum 1 update(s)")
    with pytest.raises(JobFailed):
        job.assignment("c0")


def test_model_is_read_from_the_root_node_with_the_admin_token() -> None:
    fake = FakePlatform()
    model = _job(fake).model()
    assert model.version == 2 and load(model.data)["w"].tolist() == [0, 1, 2, 3]
    reads = [r for r in fake.seen if r.url.path == "/v1/jobs/j/model"]
    assert [str(r.url.host) for r in reads] == ["gw1"]  # node1, the root
    assert reads[0].headers["authorization"] == "Bearer adm"


def test_query_asks_the_tracker_with_the_analyst_token_and_needs_it() -> None:
    fake = FakePlatform()
    with pytest.raises(ValueError, match="tracker_url and analyst_token"):
        _job(fake).query("shapley", rounds=[1])
    job = _job(fake, tracker_url=TRACKER, analyst_token="ana")
    assert job.query("shapley", rounds=[1])["result"] == {"values": {"c0": 0.5}}
    [asked] = [r for r in fake.seen if r.url.path == "/v1/queries"]
    assert asked.headers["authorization"] == "Bearer ana"
    assert json.loads(asked.content) == {
        "workload": "shapley",
        "job": "j",
        "params": {},
        "rounds": [1],
    }


def test_a_client_whose_training_raises_in_its_round_block_reports_that_it_leaves() -> None:
    fake = FakePlatform()
    job = _job(fake)
    with pytest.raises(RuntimeError, match="out of memory"), job.client("c0", round=1) as fl:
        assert fl.gateway_url == GW0 and fl.round == 1
        raise RuntimeError("out of memory")
    [sent] = [r for r in fake.seen if r.url.path.endswith("/failures")]
    assert sent.url.path == "/v1/jobs/j/rounds/1/failures" and sent.url.params["client"] == "c0"
    assert sent.headers["authorization"] == "Bearer t0"
    assert json.loads(sent.content) == {"client": "c0", "error": "RuntimeError: out of memory"}
    # once its update was accepted, an error after it is the caller's alone
    with pytest.raises(KeyError), job.client("c0", round=1) as fl:
        fl.upload(1, {"w": np.ones(4, np.float32)}, num_samples=3)
        raise KeyError("after the upload")
    assert len([r for r in fake.seen if r.url.path.endswith("/failures")]) == 1
    with pytest.raises(ValueError, match="enroll it first"):
        job.client("c1", round=1)
