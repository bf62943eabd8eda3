"""STAND-IN for a node gateway, for the coordinator's service tests only.

It speaks the part of the node gateway's HTTP API the coordinator uses and keeps only counts
(no shared memory, no aggregators, no model): ``/healthz`` (with the ``aggregators`` load
block a real gateway reports, as set by ``PUT /_standin/aggregators``), ``POST /v1/jobs``,
``GET /v1/jobs/{job}``, ``POST /v1/jobs/{job}/rounds/{r}/updates?client=`` (202; 409 for a
stale round or a duplicate client), ``PUT /v1/jobs/{job}/rounds/{r}/plan``. It has no close
route and reports no model version, so the coordinator takes its "close at goal without
versions" and "re-place the dead node's clients" paths here.

Kept for tests of coordinator logic where it is the clearer tool: bookkeeping of selection,
assignment, deadlines, 4xx on bad input, state surviving a restart, and the re-placement
path when a node dies before the survivors received anything (starting three real gateways
with aggregators per parametrized case would cost minutes and test the gateway, not the
coordinator). Whatever touches plans, aggregation or a node dying with updates in flight is
tested on real gateways: tests/control/test_real_gateways.py and
test_real_gateway_failover.py.

Run: ``python -m tests.control.gateway_standin --port P``.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def create_app() -> FastAPI:
    app = FastAPI()
    jobs: dict[str, dict[str, Any]] = {}
    # what gateway.control.node_load reports; a test sets it to drive the autoscaler
    load: dict[str, Any] = {"endpoints": 0, "free_endpoints": 0, "waiting_slots": 0, "queue": 0.0}

    def err(status: int, code: str, detail: str) -> JSONResponse:
        return JSONResponse({"error": code, "detail": detail}, status_code=status)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "aggregators": dict(load)}

    @app.put("/_standin/aggregators")
    async def set_load(request: Request) -> dict[str, Any]:
        load.update(await request.json())
        return dict(load)

    @app.post("/v1/jobs", status_code=201)
    async def create(job: str, rounds: int, goal: int, clients: str = "") -> Any:
        if job in jobs:
            return err(409, "job_exists", job)
        jobs[job] = {"round": 1, "seen": {}, "plans": {}, "goal": goal, "rounds": rounds}
        return {"job": job}

    @app.get("/v1/jobs/{job}")
    async def status(job: str) -> Any:
        j = jobs.get(job)
        if j is None:
            return err(404, "unknown_job", job)
        r = j["round"]
        return {
            "job": job,
            "round": r,
            "received": len(j["seen"].get(r, ())),
            "queue": 0.0,
            "plans": sorted(j["plans"]),
        }

    @app.post("/v1/jobs/{job}/rounds/{number}/updates", status_code=202)
    async def update(job: str, number: int, client: str, request: Request) -> Any:
        j = jobs.get(job)
        if j is None:
            return err(404, "unknown_job", job)
        await request.body()
        if number < j["round"]:
            return err(409, "stale_round", f"round {number} is closed; current is {j['round']}")
        j["round"] = number
        seen = j["seen"].setdefault(number, set())
        if client in seen:
            return err(409, "duplicate_client", client)
        seen.add(client)
        return {"accepted": True}

    @app.put("/v1/jobs/{job}/rounds/{number}/plan")
    async def plan(job: str, number: int, request: Request) -> Any:
        j = jobs.get(job)
        if j is None:
            return err(404, "unknown_job", job)
        j["plans"][number] = await request.json()
        return {"ok": True}

    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    uvicorn.run(create_app(), host="127.0.0.1", port=p.parse_args().port, log_level="warning")
