"""Round selection's logic: the Oort scheduler's query, its retries and its refusals (the
tracker's answers are scripted here), and the coordinator falling back to random with a note.
The real loop, FLStore's tracker answering a job's rounds on ``fedfaas up --with all``, is
``tests/platform/test_one_platform.py::test_an_oort_job_trains_the_clients_flstore_ranks``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from control_plane.coordinator import Coordinator
from control_plane.jobs import JobSpec, JobState, job_from_json, job_to_json, seed_of
from control_plane.selection import OortScheduler, SchedulerUnavailable, random_selection
from control_plane.store import MemoryStore
from core.services import free_port

POOL = [f"c{i}" for i in range(8)]


def scheduler(answers: Callable[[dict], httpx.Response], timeout_s: float = 2.0) -> OortScheduler:
    def handle(req: httpx.Request) -> httpx.Response:
        assert req.headers["Authorization"] == "Bearer analyst-tok"
        assert req.url.path == "/v1/queries" and req.url.params["wait"] == "true"
        return answers(json.loads(req.content))

    return OortScheduler(
        "http://tracker", "analyst-tok", timeout_s=timeout_s, transport=httpx.MockTransport(handle)
    )


def select(s: OortScheduler, want: int = 3) -> list[str]:
    async def go() -> list[str]:
        try:
            return await s.select("j", 4, POOL, want, 99)
        finally:
            await s.aclose()

    return asyncio.run(go())


def test_the_query_is_oorts_round_k_candidates_and_seed_and_its_answer_is_taken() -> None:
    seen: list[dict] = []

    def answers(q: dict) -> httpx.Response:
        seen.append(q)
        return httpx.Response(200, json={"result": {"selected": ["c5", "c1", "c7"]}})

    assert select(scheduler(answers)) == ["c5", "c1", "c7"]
    assert seen == [
        {
            "workload": "oort",
            "job": "j",
            "params": {"round": 4, "k": 3, "candidates": POOL, "window": 10, "seed": 99},
        }
    ]


def test_a_round_not_ingested_yet_is_asked_again_until_it_is() -> None:
    calls = []

    def answers(q: dict) -> httpx.Response:
        calls.append(1)
        if len(calls) < 3:
            return httpx.Response(404, json={"error": "round_not_written", "detail": "round 3"})
        return httpx.Response(200, json={"result": {"selected": ["c0", "c2", "c4"]}})

    assert select(scheduler(answers)) == ["c0", "c2", "c4"] and len(calls) == 3


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (
            422,
            {"error": "missing_data", "detail": "client c3 has no duration_s"},
            "422 missing_data: client c3 has no duration_s",
        ),
        (503, {"error": "unavailable", "detail": "no holder answered"}, "503 unavailable"),
        (200, {"result": {"ranking": []}}, "no 'selected' list"),
        (200, {"result": {"selected": ["c0", "c0", "c1"]}}, "not 3 distinct eligible"),
        (200, {"result": {"selected": ["c0", "c1", "x9"]}}, "not 3 distinct eligible"),
        (200, {"result": {"selected": ["c0", "c1"]}}, "not 3 distinct eligible"),
    ],
)
def test_an_error_or_an_unusable_answer_is_unavailable_at_once(status, body, says) -> None:  # type: ignore[no-untyped-def]
    calls = []

    def answers(q: dict) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, json=body)

    with pytest.raises(SchedulerUnavailable, match=says):
        select(scheduler(answers, timeout_s=30.0))
    assert len(calls) == 1


def test_a_round_that_never_reaches_flstore_gives_up_at_the_timeout() -> None:
    def answers(q: dict) -> httpx.Response:
        return httpx.Response(404, json={"error": "round_not_written", "detail": "round 3"})

    with pytest.raises(SchedulerUnavailable, match="round_not_written"):
        select(scheduler(answers, timeout_s=0.6))


def test_a_tracker_nobody_listens_on_is_unavailable_at_once_and_says_where_it_was() -> None:
    """Not asked again until the timeout: the coordinator holds its lock while it asks."""
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    s = OortScheduler(url, "tok", timeout_s=30.0)
    with pytest.raises(SchedulerUnavailable, match=f"unreachable at {url}/v1/queries"):
        select(s)
    calls = []

    def refuse(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("connection refused", request=req)

    s = OortScheduler(url, "tok", timeout_s=30.0, transport=httpx.MockTransport(refuse))
    with pytest.raises(SchedulerUnavailable, match="unreachable"):
        select(s)
    assert len(calls) == 1


def _open(coord: Coordinator, job: JobState) -> None:
    async def put_plan(name: str, rnd: int, slots: object) -> bool:
        return True

    coord.clients["n1"].put_plan = put_plan  # type: ignore[method-assign]
    asyncio.run(coord._open_round(job))


def _oort_job(completed: int) -> JobState:
    spec = JobSpec("j", 5, 3, list(POOL), overprovision=1.0, selection="oort")
    return JobState(spec, completed=completed, root="n1")


def test_an_oort_jobs_round_takes_the_schedulers_clients_and_round_one_is_random() -> None:
    asked: list[dict] = []

    def answers(q: dict) -> httpx.Response:
        asked.append(q["params"])
        return httpx.Response(200, json={"result": {"selected": ["c6", "c3", "c1"]}})

    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore(), scheduler=scheduler(answers))
    first = _oort_job(0)
    coord.jobs["j"] = first
    _open(coord, first)
    assert first.current is not None and first.current.selected_by == "random" and not asked
    job = _oort_job(1)
    coord.jobs["j"] = job
    _open(coord, job)
    rnd = job.current
    assert rnd is not None and rnd.number == 2
    assert (rnd.selected, rnd.selected_by, rnd.selection_note) == (["c6", "c3", "c1"], "oort", "")
    assert set(rnd.assignment) == {"c6", "c3", "c1"}
    assert asked == [
        {"round": 2, "k": 3, "candidates": POOL, "window": 10, "seed": seed_of("j", 2)}
    ]
    view = coord.job_view("j")["round"]
    assert (view["selected_by"], view["selection_note"]) == ("oort", "")
    back = job_from_json(job_to_json(job))  # the control plane's restart keeps it
    assert back.spec.selection == "oort" and back.current is not None
    assert back.current.selected_by == "oort"


def test_without_a_tracker_an_oort_jobs_round_is_random_and_says_why() -> None:
    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore())
    job = _oort_job(1)
    coord.jobs["j"] = job
    _open(coord, job)
    rnd = job.current
    assert rnd is not None and rnd.selected_by == "random"
    assert "no request tracker configured" in rnd.selection_note
    assert rnd.selected == random_selection(POOL, 3, seed_of("j", 2)).clients


def test_a_tracker_that_fails_leaves_the_round_random_with_its_error() -> None:
    def answers(q: dict) -> httpx.Response:
        return httpx.Response(422, json={"error": "missing_data", "detail": "no duration_s"})

    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore(), scheduler=scheduler(answers))
    job = _oort_job(1)
    coord.jobs["j"] = job
    _open(coord, job)
    rnd = job.current
    assert rnd is not None and rnd.selected_by == "random"
    assert rnd.selection_note == "tracker answered 422 missing_data: no duration_s"


def _dropping_job(completed: int, goal: int = 3) -> JobState:
    spec = JobSpec(
        "j",
        9,
        goal,
        list(POOL),
        overprovision=1.0,
        drop_flagged={"workload": "multi-krum", "params": {"f": 2}},
    )
    return JobState(spec, completed=completed, root="n1")


def test_flagged_clients_leave_later_rounds_but_never_below_the_goal() -> None:
    """The debugging loop's logic (scripted tracker answers; the real loop is the platform
    test ``test_a_job_drops_the_clients_flstore_flagged_before_aggregating_the_next_round``):
    the ended round's flags are asked with the job's params, the flagged leave the pool and
    the round's plan names them, an unknown id is ignored, the pool never shrinks below the
    goal (the round's note says who was kept), and no answer keeps the flags so far."""
    asked: list[dict] = []
    flags = {1: ["c2", "c5", "ghost"], 2: ["c0", "c1", "c3", "c4"], 3: None}

    def answers(q: dict) -> httpx.Response:
        asked.append({"workload": q["workload"], **q["params"]})
        got = flags[q["params"]["round"]]
        if got is None:
            return httpx.Response(503, json={"error": "unavailable", "detail": "down"})
        return httpx.Response(200, json={"result": {"flagged": got}})

    coord = Coordinator({"n1": "http://n1"}, store=MemoryStore(), scheduler=scheduler(answers))
    job = _dropping_job(1)
    coord.jobs["j"] = job
    _open(coord, job)
    rnd = job.current
    assert rnd is not None and asked == [{"workload": "multi-krum", "f": 2, "round": 1}]
    assert set(job.flagged) == {"c2", "c5"} and rnd.drop_note == ""
    assert rnd.excluded == {c: {"flagged_in": 1, "workload": "multi-krum"} for c in ("c2", "c5")}
    assert not {"c2", "c5"} & set(rnd.selected) and len(rnd.selected) == 3
    job.current, job.completed = None, 2
    _open(coord, job)  # 6 selectable, goal 3: three of the four flagged go, one is kept
    rnd = job.current
    assert rnd is not None and len(job.selectable()) == 3 and len(job.flagged) == 5
    assert "kept" in rnd.drop_note and "fewer than the goal of 3" in rnd.drop_note
    job.current, job.completed = None, 3
    _open(coord, job)  # the tracker is down: the flags so far stay
    rnd = job.current
    assert rnd is not None and len(job.flagged) == 5 and "503 unavailable" in rnd.drop_note
    assert set(rnd.selected) == set(job.selectable())
    back = job_from_json(job_to_json(job))  # the control plane's restart keeps them
    assert back.flagged == job.flagged and back.current is not None
    assert back.current.excluded == rnd.excluded
