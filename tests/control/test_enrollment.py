"""Enrollment (issue 14, item 1): a job is created with its model and policy, not a client list;
clients enroll with the job's enrollment token (or the admin's), each gets its own token, and
can leave. On a coordinator over two real node gateways (``python -m gateway``, real Redis,
aggregator replicas): 10,000 clients enroll, round 1 opens at the enrollment that reaches the
goal, the selected clients upload to the gateways the assignment names (which admit them from
the round's plan: they were never given a client list), and the round publishes their FedAvg.
"""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import pytest
from safetensors.numpy import load, save

from control_plane.coordinator import Coordinator
from core.auth import bearer
from tests.control import realgw
from tests.polling import wait_until
from tests.tokens import control_client

pytestmark = pytest.mark.integration

W0 = {"a": np.zeros(16, np.float32)}
ENROLLED = 10_000


def test_ten_thousand_clients_enroll_and_the_selected_ones_train_a_round(
    redis_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    with realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs):
        coord = Coordinator(urls, mc=50.0, admin_token=secret)
        with control_client(coord, secret, tick_s=0.05) as api:
            r = api.post(  # no client list: a model and a policy
                "/v1/jobs",
                json={
                    "job": "en",
                    "rounds": 1,
                    "goal": 6,
                    "weights_b64": base64.b64encode(save(W0)).decode(),
                },
            )
            assert r.status_code == 201, r.text
            created = r.json()
            assert created["waiting_for_clients"] and created["round"] is None
            assert created["tokens"] == {}
            enroll_tok = created["enrollment_token"]

            # a client enrolls itself with the enrollment token the job's owner handed out
            r = api.post(
                "/v1/jobs/en/clients", json={"clients": ["me"]}, headers=bearer(enroll_tok)
            )
            assert r.status_code == 201, r.text
            my_token = r.json()["tokens"]["me"]
            assert r.json()["enrolled"] == 1
            # ... which is good for nothing else
            assert api.get("/v1/jobs/en", headers=bearer(enroll_tok)).status_code == 403
            assert api.delete("/v1/jobs/en", headers=bearer(enroll_tok)).status_code == 403
            # the rest, 9,999, in one call of the admin
            ids = [f"d{i}" for i in range(ENROLLED - 1)]
            t0 = time.perf_counter()
            r = api.post("/v1/jobs/en/clients", json={"clients": ids})
            took = time.perf_counter() - t0
            assert r.status_code == 201, r.text
            tokens = {"me": my_token, **r.json()["tokens"]}
            assert len(tokens) == ENROLLED and r.json()["enrolled"] == ENROLLED
            print(f"9,999 clients enrolled in one call: {took * 1000:.0f} ms")
            # enrolling again is idempotent: the same token
            again = api.post(
                "/v1/jobs/en/clients", json={"clients": ["d7"]}, headers=bearer(enroll_tok)
            )
            assert (
                again.json()["tokens"]["d7"] == tokens["d7"]
                and again.json()["enrolled"] == ENROLLED
            )

            view = api.get("/v1/jobs/en").json()
            assert not view["waiting_for_clients"] and view["round"]["number"] == 1
            assert view["enrolled"] == view["eligible"] == ENROLLED
            selected: dict[str, str] = {}
            plan = api.get("/v1/jobs/en/plan").json()
            for c in plan["client_nodes"]:
                a = api.get(
                    "/v1/jobs/en/assignment", params={"client": c}, headers=bearer(tokens[c])
                )
                assert a.status_code == 200, a.text
                selected[c] = a.json()["gateway_url"]
            assert len(selected) == 8  # ceil(6 * 1.3)
            outside = next(c for c in tokens if c not in selected)
            a = api.get(
                "/v1/jobs/en/assignment",
                params={"client": outside},
                headers=bearer(tokens[outside]),
            )
            assert a.status_code == 409 and a.json()["error"] == "client_not_selected"

            # a selected client leaves: its token is refused from then on
            quitter = sorted(selected)[0]
            r = api.delete(
                f"/v1/jobs/en/clients/{quitter}",
                params={"client": quitter},
                headers=bearer(tokens[quitter]),
            )
            assert r.status_code == 200, r.text
            a = api.get(
                "/v1/jobs/en/assignment",
                params={"client": quitter},
                headers=bearer(tokens[quitter]),
            )
            assert a.status_code == 403 and a.json()["error"] == "client_revoked"
            r = api.post(
                "/v1/jobs/en/clients", json={"clients": [quitter]}, headers=bearer(enroll_tok)
            )
            assert r.status_code == 403 and r.json()["error"] == "client_revoked"
            # a client may not take another one out
            other = sorted(selected)[1]
            r = api.delete(
                f"/v1/jobs/en/clients/{other}",
                params={"client": quitter},
                headers=bearer(tokens[quitter]),
            )
            assert r.status_code in (401, 403)

            # the others upload to the gateways they were sent to, which admit them from the plan
            vals = {}
            for i, (c, url) in enumerate(sorted(selected.items())):
                if c == quitter:
                    continue
                x = {"a": np.full(16, float(i), np.float32)}
                r = realgw.upload(url, "en", 1, c, tokens[c], x, 1 + i)
                if r.status_code == 202:
                    vals[c] = (float(i), 1 + i)
                else:  # the round closed at its goal of 6
                    assert r.status_code == 409, r.text
            r = realgw.upload(selected[quitter], "en", 1, quitter, tokens[quitter], W0, 1)
            assert r.status_code == 403, r.text
            assert len(vals) >= 6
            done = wait_until(
                lambda: api.get("/v1/jobs/en").json()["done"], 60, "round 1 published"
            )
            assert done
            hist = api.get("/v1/jobs/en").json()["history"][-1]
            used = sorted(vals.items())[: hist["aggregated"]]
            model = load(
                httpx.get(
                    f"{next(iter(urls.values()))}/v1/jobs/en/model",
                    headers=bearer(tokens[used[0][0]]),
                ).content
            )
            want = sum(v * w for _, (v, w) in used) / sum(w for _, (_, w) in used)
            np.testing.assert_allclose(model["a"], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"clients": []}, "1 to 10000"),
        ({"clients": "c1"}, "clients"),
        ({"clients": ["ok", "not ok"]}, "not ok"),
        ({"client": ["c1"]}, "clients"),
        ([1, 2], "clients"),
    ],
)
def test_a_bad_enrollment_says_what_is_wrong_and_enrolls_nobody(gateways, body, says) -> None:  # type: ignore[no-untyped-def]
    coord = Coordinator({g.name: g.url for g in gateways}, admin_token="s3cret")
    with control_client(coord, "s3cret") as api:
        api.delete("/v1/jobs/bad")
        r = api.post(
            "/v1/jobs",
            json={
                "job": "bad",
                "rounds": 1,
                "goal": 2,
                "weights_b64": base64.b64encode(save(W0)).decode(),
            },
        )
        assert r.status_code == 201, r.text
        r = api.post("/v1/jobs/bad/clients", json=body)
        assert r.status_code == 422 and says in r.json()["detail"], r.text
        assert api.get("/v1/jobs/bad").json()["enrolled"] == 0
        r = api.post(
            "/v1/jobs/bad/clients",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 422 and r.json()["error"] == "invalid_input"
        r = api.post("/v1/jobs/bad/clients", json={"clients": ["x"]}, headers=bearer("nope"))
        assert r.status_code == 401
