"""Client tokens are per job incarnation, and one client can be revoked on every node.

Real node gateway processes (``python -m gateway``) with aggregator replicas and a real Redis
journal: a job deleted and created again under the same name refuses the old tokens (also on
a restarted gateway and on the job's other node), and a client revoked through one node is
refused on both while the others finish the round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.stack import start_gateway
from client.sdk import create_job
from tests.control import realgw
from tests.dataplane.gwproc import gateway_process
from tests.dataplane.gwutil import tiny_bytes
from tests.dataplane.rounds import post_update
from tests.polling import wait_until

pytestmark = pytest.mark.integration


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _upload(url: str, job: str, client: str, token: str) -> httpx.Response:
    return post_update(url, job, 1, token, client, tiny_bytes(7), 3)


def _model(url: str, job: str, token: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/jobs/{job}/model", headers=_auth(token), timeout=30)


def _error(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]


def test_a_job_created_again_refuses_the_old_tokens_also_after_a_restart(
    tmp_path: Path, redis_url: str
) -> None:
    with gateway_process(tmp_path, redis_url) as (gw, admin):
        made = dict(rounds=1, goal=1, clients=["c0", "c1"])
        old = create_job(gw.url, admin, "again", tiny_bytes(0), **made).tokens  # type: ignore[arg-type]
        assert httpx.delete(f"{gw.url}/v1/jobs/again", headers=_auth(admin)).status_code == 204
        new = create_job(gw.url, admin, "again", tiny_bytes(0), **made).tokens  # type: ignore[arg-type]
        assert set(new) == {"c0", "c1"} and not set(new.values()) & set(old.values())
        assert _error(_upload(gw.url, "again", "c0", old["c0"])) == (401, "unauthorized")
        assert _error(_model(gw.url, "again", old["c0"])) == (401, "unauthorized")
        status = httpx.get(f"{gw.url}/v1/jobs/again", headers=_auth(old["c1"]))
        assert _error(status) == (401, "unauthorized")

        gw.stop()  # the salt is in the journal: a restarted gateway computes the same tokens
        again = start_gateway(gw.settings, tmp_path / "gateway-2.log")
        try:
            assert _model(again.url, "again", new["c0"]).status_code == 200
            assert _error(_model(again.url, "again", old["c0"])) == (401, "unauthorized")
            assert _upload(again.url, "again", "c1", new["c1"]).status_code == 202
        finally:
            again.stop()


def _create_rv(url: str, admin: dict[str, str]) -> httpx.Response:
    """Job ``rv`` on nodes n1 (its root, at ``url``) and n2: 4 clients, a goal of 2."""
    r = httpx.post(
        f"{url}/v1/jobs",
        params={"job": "rv", "rounds": 1, "goal": 2, "clients": "c0,c1,c2,c3", "nodes": "n1,n2"},
        content=tiny_bytes(0),
        headers=admin,
        timeout=120,
    )
    assert r.status_code == 201, r.text
    return r


def test_a_revoked_client_is_refused_on_both_nodes_while_the_others_finish_the_round(
    tmp_path: Path, redis_url: str
) -> None:
    with realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs):
        n1, n2 = urls["n1"], urls["n2"]
        admin = _auth(secret)
        r = _create_rv(n1, admin)
        info: dict[str, Any] = r.json()
        tokens = info["tokens"]
        # the gateway's own plan: c0, c1 upload to n1 and c2, c3 to n2; one update per node
        assert info["plan"]["client_nodes"] == {"c0": "n1", "c1": "n1", "c2": "n2", "c3": "n2"}
        wait_until(
            lambda: httpx.get(f"{n2}/v1/jobs/rv", headers=admin).is_success, 20, "n2 knows the job"
        )

        assert _upload(n1, "rv", "c1", tokens["c1"]).status_code == 202  # n1's one update
        revoke = f"{n1}/v1/jobs/rv/clients"
        assert httpx.delete(f"{revoke}/c2").status_code == 401  # the admin's only
        first = httpx.delete(f"{revoke}/c2", headers=admin)
        assert first.status_code == 200 and first.json()["revoked"] == ["c2"]
        assert httpx.delete(f"{revoke}/c2", headers=admin).json() == first.json()  # idempotent
        assert _error(httpx.delete(f"{revoke}/c9", headers=admin)) == (404, "unknown_client")
        gone = httpx.delete(f"{n1}/v1/jobs/nope/clients/c2", headers=admin)
        assert _error(gone) == (404, "unknown_job")

        # n1 refuses at once; n2 learns it from the journal (its housekeeping loop)
        assert _error(_model(n1, "rv", tokens["c2"])) == (403, "client_revoked")
        wait_until(lambda: _model(n2, "rv", tokens["c2"]).status_code == 403, 20, "n2 refuses c2")
        refused = _upload(n2, "rv", "c2", tokens["c2"])
        assert _error(refused) == (403, "client_revoked") and "revoked" in refused.json()["detail"]
        assert _error(_upload(n1, "rv", "c2", tokens["c2"])) == (403, "client_revoked")
        st = httpx.get(f"{n2}/v1/jobs/rv", headers=admin).json()
        assert st["revoked"] == ["c2"] and st["received"] == 0

        # c3 is n2's last client for its goal of one update: not revoked without force
        short = httpx.delete(f"{revoke}/c3", headers=admin)
        assert _error(short) == (409, "too_few_clients") and "n2" in short.json()["detail"]

        # revoked after its update was accepted: that update still counts
        assert httpx.delete(f"{revoke}/c1", headers=admin).json()["revoked"] == ["c1", "c2"]
        assert _error(_model(n1, "rv", tokens["c1"])) == (403, "client_revoked")
        assert _upload(n2, "rv", "c3", tokens["c3"]).status_code == 202
        wait_until(
            lambda: _model(n1, "rv", tokens["c0"]).headers.get("x-model-version") == "1",
            20,
            "round 1 published",
        )
        assert _error(_model(n2, "rv", tokens["c2"])) == (403, "client_revoked")

        # a forced revocation goes through and says which node is now short of clients
        forced = httpx.delete(f"{revoke}/c3", params={"force": "true"}, headers=admin)
        assert forced.status_code == 200, forced.text
        assert forced.json()["short_nodes"] == {"n2": {"clients": 0, "goal": 1}}

        # deleted on its root and created again: both nodes take the new incarnation
        assert httpx.delete(f"{n1}/v1/jobs/rv", headers=admin).status_code == 204
        r = _create_rv(n1, admin)
        fresh = r.json()["tokens"]
        wait_until(
            lambda: _model(n2, "rv", fresh["c2"]).status_code == 200, 20, "n2 takes the new job"
        )
        assert _error(_model(n2, "rv", tokens["c3"])) == (401, "unauthorized")
        assert _error(_upload(n2, "rv", "c3", tokens["c3"])) == (401, "unauthorized")
        assert httpx.get(f"{n2}/v1/jobs/rv", headers=admin).json()["revoked"] == []
