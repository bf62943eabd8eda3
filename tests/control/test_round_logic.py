"""Round logic of the coordinator with fake gateway answers: a round closed at its deadline
whose model never comes fails the job instead of leaving the gateways on it, a failed job stays
failed across a restart (issue 13, item 4), and a new round answers assignments only once its
plan reached the gateways. The real-gateway cases (re-open, fail at the minimum) are in
test_real_gateways.py."""

from __future__ import annotations

import asyncio

from control_plane.coordinator import Coordinator
from control_plane.gateways import GatewayJobStatus
from control_plane.jobs import JobSpec, JobState, RoundInfo, job_from_json, job_to_json
from control_plane.store import MemoryStore


def test_no_model_a_deadline_after_closing_fails_the_job_and_drops_it_on_the_gateways() -> None:
    now = [0.0]
    coord = Coordinator({"n1": "http://n1"}, clock=lambda: now[0], store=MemoryStore())
    spec = JobSpec("j", rounds=3, goal=2, clients=["a", "b"], deadline_s=5.0)
    job = JobState(spec, root="n1")
    # closed at its deadline (t=5) on one update; the top never publishes (version stays 0)
    job.current = RoundInfo(
        1,
        "aggregating",
        2,
        ["a", "b"],
        {"a": "n1", "b": "n1"},
        0.0,
        5.0,
        received={"n1": 1},
        closing="deadline",
        closed_with={"n1": 1},
    )
    coord.jobs["j"] = job
    dropped: list[str] = []
    gw = coord.clients["n1"]

    async def job_status(name: str) -> GatewayJobStatus:
        return GatewayJobStatus(round=1, received=1, version=0, queue=0.0, reports_version=True)

    async def delete_job(name: str) -> bool:
        dropped.append(name)
        return True

    gw.job_status = job_status  # type: ignore[method-assign]
    gw.delete_job = delete_job  # type: ignore[method-assign]

    now[0] = 9.9  # inside the second deadline: still waiting for the model
    asyncio.run(coord.poll())
    assert not job.failed and job.current.state == "aggregating" and not dropped
    now[0] = 10.1
    asyncio.run(coord.poll())
    assert job.failed == (
        "round 1: no global model published a deadline (5 s) after it was closed (deadline)"
    )
    assert job.current.state == "failed" and job.current.number == 1  # no round 2 opened
    assert dropped == ["j"] and job.history[-1]["state"] == "failed"
    view = coord.job_view("j")
    assert view["failed"] == job.failed and not view["done"]
    # the failure survives a restart of the control plane (its state is in the store)
    back = job_from_json(job_to_json(job))
    assert back.failed == job.failed and back.current is not None
    assert back.current.state == "failed"


def test_the_simulators_assignment_says_the_job_failed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A simulated client waiting for the next round hears JobFailed (with the control
    plane's reason) instead of waiting out its timeout; its assignment call too."""
    import httpx
    import pytest

    from client.sdk import JobFailed
    from client.simulator import control_plane_assignment

    reason = "round 2: 0 of its minimum 1 update(s) arrived by the deadline"

    def get(url: str, **kw: object) -> httpx.Response:
        req = httpx.Request("GET", url)
        if url.endswith("/assignment"):
            body = {"error": "job_failed", "detail": f"job 'j' failed: {reason}"}
            return httpx.Response(409, json=body, request=req)
        return httpx.Response(200, json={"failed": reason, "round": {}}, request=req)

    monkeypatch.setattr(httpx, "get", get)
    assign = control_plane_assignment("http://cp", "j", {"a": "tok"})
    with pytest.raises(JobFailed) as err:
        assign("a")
    assert reason in err.value.reason
    with pytest.raises(JobFailed) as err:
        assign.wait_round(2, timeout=60)
    assert err.value.reason == reason


def test_a_new_rounds_assignments_answer_only_once_its_plan_reached_the_gateways() -> None:
    """The soak found it: clients asked for their assignment while the control plane was
    still pushing the new round's plan, uploaded to a gateway still on its static plan and
    were refused 409 ``wrong_node``. The round is visible only once the push is done."""
    import pytest

    from control_plane.errors import ClientNotSelected

    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore())
    job = JobState(JobSpec("j", rounds=3, goal=2, clients=["a", "b"], overprovision=1.0))
    job.root = "n1"
    coord.jobs["j"] = job
    seen: list[str] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def put_plan(name: str, rnd: int, slots: object) -> bool:
            # while the plan travels, a client asks where to upload
            with pytest.raises(ClientNotSelected):
                coord.assignment("j", "a")
            seen.append("refused while pushing")
            await release.wait()
            return True

        coord.clients["n1"].put_plan = put_plan  # type: ignore[method-assign]
        opening = asyncio.create_task(coord._open_round(job))
        await asyncio.sleep(0.01)
        assert seen == ["refused while pushing"] and job.current is None
        release.set()
        rnd = await opening
        assert job.current is rnd and rnd.placement == "coordinator"
        assert coord.assignment("j", "a") == (1, "n1", "http://n1", 0)

    asyncio.run(scenario())


def test_a_long_job_keeps_its_newest_rounds_and_totals_over_all_of_them() -> None:
    """The job's record (rewritten on every change, in Redis) stays bounded however many rounds
    the job runs: ``history`` keeps the newest HISTORY_ROUNDS, ``totals`` counts every round,
    and both survive a restart of the control plane."""
    from control_plane.jobs import HISTORY_ROUNDS

    job = JobState(JobSpec("j", rounds=5000, goal=2, clients=["a", "b"]), root="n1")
    n = 3 * HISTORY_ROUNDS + 7
    for r in range(1, n + 1):
        job.record({"round": r, "state": "closed", "received": 2, "aggregated": 2, "lost": r % 3})
    assert [h["round"] for h in job.history] == list(range(n - HISTORY_ROUNDS + 1, n + 1))
    assert job.totals == {
        "rounds": n,
        "received": 2 * n,
        "aggregated": 2 * n,
        "lost": sum(r % 3 for r in range(1, n + 1)),
    }
    back = job_from_json(job_to_json(job))
    assert back.history == job.history and back.totals == job.totals
    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore())
    coord.jobs["j"] = job
    assert coord.job_view("j")["totals"]["rounds"] == n


def test_a_close_that_keeps_failing_after_the_deadline_fails_the_job_after_close_retries() -> None:
    """Round logic with fake gateway answers: at the deadline, n2 keeps refusing the close
    (n1 stops its intake). Each poll past the retry pause tries n2 again; the job fails only
    at the ``close_retries``-th failed attempt, naming n2's error, and is dropped on both."""
    from control_plane.errors import GatewayError

    now = [0.0]
    coord = Coordinator(
        {"n1": "http://n1", "n2": "http://n2"},
        clock=lambda: now[0],
        store=MemoryStore(),
        close_retries=3,
    )
    spec = JobSpec("j", rounds=1, goal=4, clients=["a", "b", "c", "d"], deadline_s=5.0)
    job = JobState(spec, root="n1")
    assignment = {"a": "n1", "b": "n1", "c": "n2", "d": "n2"}
    job.current = RoundInfo(1, "open", 4, list(assignment), assignment, 0.0, 5.0)
    coord.jobs["j"] = job
    calls: list[tuple[str, object]] = []
    dropped: list[str] = []
    for node in ("n1", "n2"):
        gw = coord.clients[node]

        async def job_status(name: str, node: str = node) -> GatewayJobStatus:
            return GatewayJobStatus(round=1, received=1, version=0, queue=0.0, reports_version=True)

        async def close_round(name: str, rnd: int, received: object, node: str = node) -> dict:
            calls.append((node, received))
            if node == "n2":
                raise GatewayError("n2", "close answered 503: busy", error="busy")
            return {"received": 1}

        async def delete_job(name: str, node: str = node) -> bool:
            dropped.append(node)
            return True

        gw.job_status = job_status  # type: ignore[method-assign]
        gw.close_round = close_round  # type: ignore[method-assign,assignment]
        gw.delete_job = delete_job  # type: ignore[method-assign]

    now[0] = 5.1  # the deadline passes with the minimum (1) in: close with what arrived
    asyncio.run(coord.poll())
    rnd = job.current
    assert rnd.close_pending == "deadline" and rnd.close_attempts == 1 and not job.failed
    assert (
        sorted(rnd.close_counts) == ["n1"]
        and "n2: node 'n2': close answered 503" in rnd.close_error
    )
    asyncio.run(coord.poll())  # within the pause: n2 is not asked again
    assert rnd.close_attempts == 1 and calls.count(("n2", None)) == 1
    now[0] += 10.0
    asyncio.run(coord.poll())
    assert rnd.close_attempts == 2 and not job.failed
    assert calls.count(("n1", None)) == 1  # n1 stopped its intake once: it is not asked again
    now[0] += 10.0
    asyncio.run(coord.poll())
    assert job.failed.startswith("round 1: 2 update(s) arrived by the deadline, but the gateways")
    assert "in 3 attempts: n2: node 'n2': close answered 503: busy" in job.failed
    assert sorted(dropped) == ["n1", "n2"] and job.current.state == "failed"
