"""The control plane's ``lost`` counts the acknowledged updates the node gateways report in no
published model (their job status's ``dropped``, also ``fedfaas_gateway_updates_dropped_total``),
not only those lost with a dead node: each dropped slot once, in its round's ``lost``, the
job's ``totals`` and view, and ``fedfaas_control_job_updates_lost``, across polls, after the
round ended, and across a restart of the control plane. Gateway answers are fakes in the
shape of a real gateway's ``GET /v1/jobs/{job}`` (``gateway.jobs.Job.status``; the real
gateways' drops are tested in tests/dataplane/test_partial_forwarding.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from control_plane.api import metrics_text
from control_plane.closing import DROP_WATCH_S
from control_plane.coordinator import Coordinator
from control_plane.gateways import GatewayJobStatus
from control_plane.jobs import JobSpec, JobState, RoundInfo, job_from_json, job_to_json
from control_plane.store import MemoryStore


def _status(rnd: int, received: int, version: int, drops: list[tuple[int, int, int]]) -> Any:
    """A gateway's job status (the fields the coordinator reads, as ``Job.status`` has them)."""
    return {
        "job": "j",
        "round": rnd,
        "version": version,
        "received": received,
        "status": "running",
        "dropped": {
            "updates": sum(n for _, _, n in drops),
            "recent": [
                {"round": r, "slot": s, "updates": n, "clients": ["b"], "reason": "stale"}
                for r, s, n in drops
            ],
        },
        "last_round": None
        if version == 0
        else {"round": version, "count": 1, "published_ns": 5, "result_ns": 4},
    }


def _lost_metric(coord: Coordinator) -> float:
    for line in metrics_text(coord).decode().splitlines():
        if line.startswith('fedfaas_control_job_updates_lost{job="j"}'):
            return float(line.split()[-1])
    raise AssertionError("no fedfaas_control_job_updates_lost for job j")


def test_updates_a_gateway_reports_dropped_count_once_in_the_rounds_lost() -> None:
    now = [1.0]
    coord = Coordinator(
        {"n1": "http://n1", "n2": "http://n2"},
        clock=lambda: now[0],
        store=MemoryStore(),
        auto_rounds=False,
    )
    spec = JobSpec("j", rounds=2, goal=2, clients=["a", "b"], deadline_s=100.0)
    job = JobState(spec, root="n1")
    job.current = RoundInfo(1, "open", 2, ["a", "b"], {"a": "n1", "b": "n2"}, 0.0, 100.0)
    coord.jobs["j"] = job
    answers: dict[str, Any] = {
        "n1": _status(1, 1, 0, []),
        "n2": _status(1, 1, 0, [(1, 3, 1)]),  # b's update: its partial refused by the root
    }
    for node, gw in coord.clients.items():

        async def job_status(name: str, node: str = node) -> GatewayJobStatus:
            return GatewayJobStatus.from_json(answers[node])

        gw.job_status = job_status  # type: ignore[method-assign]

    asyncio.run(coord.poll())
    asyncio.run(coord.poll())  # the same report again: counted once
    assert job.current.lost == 1 and coord.job_view("j")["lost"] == 1
    assert coord.job_view("j")["round"]["lost"] == 1 and _lost_metric(coord) == 1

    answers["n1"] = _status(2, 0, 1, [])  # the root published round 1 (with a's update only)
    asyncio.run(coord.poll())
    assert job.current.state == "closed"
    assert job.history[-1]["lost"] == 1 and job.totals["lost"] == 1

    # after the round ended, n1 reports one more dropped (a slot unfinished when it ended there)
    answers["n1"] = _status(2, 0, 1, [(1, 2, 1)])
    now[0] += DROP_WATCH_S / 2
    asyncio.run(coord.poll())
    assert job.history[-1]["lost"] == 2 and job.totals["lost"] == 2
    assert coord.job_view("j")["lost"] == 2 and _lost_metric(coord) == 2

    # a restarted control plane keeps what it counted, and counts nothing twice
    back = job_from_json(job_to_json(job))
    assert back.count_dropped("n2", 1, 3, 1) == 0 and back.count_dropped("n1", 1, 2, 1) == 0
    assert back.lost() == 2


def test_a_gateway_status_without_drops_or_with_malformed_ones_reads_as_none() -> None:
    assert GatewayJobStatus.from_json({"round": 1, "version": 0}).dropped == ()
    bad = {"round": 1, "dropped": {"recent": [{"round": "1", "slot": 2, "updates": 1}, 7]}}
    assert GatewayJobStatus.from_json(bad).dropped == ()
    good = _status(3, 0, 2, [(3, 4, 2)])
    assert GatewayJobStatus.from_json(good).dropped == ((3, 4, 2),)
