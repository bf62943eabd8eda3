"""The control plane's client tokens: salted per job incarnation, revocable.

A coordinator over two real node gateways (``python -m gateway``, real Redis, aggregator
replicas): the create answer carries the clients' tokens; ``DELETE /v1/jobs/{job}/clients/{id}``
revokes one on the control plane and on the gateways (its assignment answers 403, its uploads
403 on both nodes) while the others finish the round; a job deleted and created again refuses
the tokens of the one before, on the assignment route and on the gateways.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from control_plane.coordinator import Coordinator
from core.auth import bearer
from tests.control import realgw
from tests.polling import wait_until
from tests.tokens import control_client

pytestmark = pytest.mark.integration

W0 = {"a": np.zeros(16, np.float32)}


def _create(api: Any, name: str, rounds: int = 1) -> dict[str, Any]:
    r = api.post(
        "/v1/jobs",
        json={
            "job": name,
            "rounds": rounds,
            "goal": 2,
            "clients": 4,
            "weights_b64": base64.b64encode(save(W0)).decode(),
        },
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def _error(r: Any) -> tuple[int, str]:
    return r.status_code, r.json()["error"]


def test_revoke_on_the_control_plane_and_a_job_created_again(redis_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs):
        coord = Coordinator(urls, mc=3.0, admin_token=secret)
        with control_client(coord, secret, tick_s=0.05) as api:
            job = _create(api, "cp", rounds=3)
            tokens = job["tokens"]
            assert sorted(tokens) == ["c0", "c1", "c2", "c3"]
            where = {}
            for c, tok in tokens.items():  # each client asks with its own token
                a = api.get("/v1/jobs/cp/assignment", params={"client": c}, headers=bearer(tok))
                assert a.status_code in (200, 409), a.text
                if a.status_code == 200:
                    where[c] = a.json()["gateway_url"]
            assert len(where) == 3  # ceil(2 * 1.3) of 4 clients selected
            gone, *left = sorted(where)

            assert api.delete(f"/v1/jobs/cp/clients/{gone}", headers=bearer("x")).status_code == 401
            r = api.delete(f"/v1/jobs/cp/clients/{gone}")
            assert r.status_code == 200, r.text
            assert r.json()["revoked"] == [gone] and sorted(r.json()["gateways"]) == ["n1", "n2"]
            assert api.delete(f"/v1/jobs/cp/clients/{gone}").json()["revoked"] == [gone]
            assert _error(api.delete("/v1/jobs/cp/clients/zz")) == (404, "unknown_client")
            assert _error(api.delete("/v1/jobs/nope/clients/c0")) == (404, "unknown_job")

            mine = api.get(
                "/v1/jobs/cp/assignment", params={"client": gone}, headers=bearer(tokens[gone])
            )
            assert _error(mine) == (403, "client_revoked")
            for url in urls.values():  # the control plane told both gateways
                res = realgw.upload(url, "cp", 1, gone, tokens[gone], W0, 1)
                assert _error(res) == (403, "client_revoked")

            for c in left:  # the others finish the round
                res = realgw.upload(
                    where[c], "cp", 1, c, tokens[c], {"a": np.ones(16, np.float32)}, 2
                )
                assert res.status_code == 202, res.text
            view = realgw.completed(api, "cp", 1, 60)
            assert view["history"][0]["received"] == 2

            # round 2 selects from the 3 clients left (a revoked one never again); the view
            # shows the closed round until the coordinator has opened the next
            rnd = wait_until(
                lambda: (r := api.get("/v1/jobs/cp").json()["round"])["number"] == 2 and r,
                60,
                "round 2 open",
            )
            assert rnd["selected"] == 3 and rnd["goal"] == 2
            # 3 clients are left for a goal of 2: one more may go, not two without force
            rest = sorted(set(tokens) - {gone})
            assert api.delete(f"/v1/jobs/cp/clients/{rest[0]}").status_code == 200
            short = api.delete(f"/v1/jobs/cp/clients/{rest[1]}")
            assert _error(short) == (409, "too_few_clients")
            forced = api.delete(f"/v1/jobs/cp/clients/{rest[1]}", params={"force": "true"})
            assert forced.status_code == 200 and len(forced.json()["revoked"]) == 3
            # forced: the open round's goal drops to its one selected client left, who ends it
            assert api.get("/v1/jobs/cp").json()["round"]["goal"] == 1
            last = rest[2]
            a = api.get(
                "/v1/jobs/cp/assignment", params={"client": last}, headers=bearer(tokens[last])
            )
            assert a.status_code == 200, a.text
            url = a.json()["gateway_url"]
            # as a client trains on round 1's model first: its gateway opens round 2 once it
            # has that model, a moment after the root
            wait_until(
                lambda: (
                    httpx.get(f"{url}/v1/jobs/cp", headers=bearer(tokens[last])).json()["version"]
                    >= 1
                ),
                60,
                "the client's gateway has round 1's model",
            )
            up = realgw.upload(url, "cp", 2, last, tokens[last], W0, 1)
            assert up.status_code == 202, up.text
            # round 3 shows once its plan reached the gateways, a moment after the close
            view = realgw.completed(api, "cp", 2, 60, next_open=True)
            assert view["history"][1]["received"] == 1
            # and the next rounds need the one update that can still come
            assert view["round"]["number"] == 3 and view["round"]["goal"] == 1
            assert view["round"]["selected"] == 1

            # deleted and created again: a new salt; the old tokens are refused everywhere
            assert api.delete("/v1/jobs/cp").status_code == 204
            again = _create(api, "cp")["tokens"]
            assert not set(again.values()) & set(tokens.values())
            old = api.get(
                "/v1/jobs/cp/assignment", params={"client": "c0"}, headers=bearer(tokens["c0"])
            )
            assert old.status_code == 401, old.text
            new = api.get(
                "/v1/jobs/cp/assignment", params={"client": "c0"}, headers=bearer(again["c0"])
            )
            assert new.status_code in (200, 409), new.text  # admitted (selected or not)
            for url in urls.values():
                assert _error(realgw.upload(url, "cp", 1, "c0", tokens["c0"], W0, 1)) == (
                    401,
                    "unauthorized",
                )


def test_the_salt_and_the_revoked_clients_survive_a_control_plane_restart(redis_url) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from control_plane.errors import ClientRevoked
    from control_plane.jobs import JobSpec, JobState, job_to_json
    from control_plane.store import RedisStore

    async def run() -> None:
        state = JobState(JobSpec("kept", 1, 1, ["a", "b"]), salt="s1", revoked=["b"])
        creds = redis_url.credentials_file("control-plane")
        store = RedisStore(redis_url, creds)
        await store.save("kept", job_to_json(state))
        await store.aclose()
        coord = Coordinator({"n1": "http://127.0.0.1:1"}, store=RedisStore(redis_url, creds))
        await coord.start()
        try:
            assert coord.salt_of("kept") == "s1" and coord.salt_of("other") is None
            assert coord.jobs["kept"].revoked == ["b"] and coord.jobs["kept"].eligible() == ["a"]
            with pytest.raises(ClientRevoked) as refused:
                coord.assignment("kept", "b")
            assert refused.value.status == 403
        finally:
            await coord.stop()

    asyncio.run(run())
