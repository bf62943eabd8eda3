"""A node gateway SIGKILLed mid-round, on real gateways (``python -m gateway``, 3 nodes).

The coordinator pushes its plan to the gateways; when one dies it is taken out of placement,
the round's goal drops to the updates that reached the surviving nodes (the dead node's
accepted updates are lost with its shared memory) and the round completes with exactly
their FedAvg.
"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from control_plane.coordinator import Coordinator
from tests.control import realgw
from tests.polling import wait_until
from tests.tokens import control_client

pytestmark = pytest.mark.integration


def middles_done(url: str, secret: str) -> bool:
    """True when the gateway's middle slots of job ``root`` have all finished."""
    st = httpx.get(f"{url}/v1/jobs/root", headers={"Authorization": f"Bearer {secret}"}).json()
    slots = (st.get("progress") or {}).get("slots", {}).values()
    mids = [s for s in slots if s["role"] == 2 and s["node"] == st["node"]]
    return bool(mids) and all(s["done"] for s in mids)


def test_a_gateway_killed_mid_round_leaves_placement_and_the_round_is_fedavg_of_survivors(
    redis_url, tmp_path
):
    names = ("n1", "n2", "n3")
    with realgw.real_gateways(redis_url, tmp_path, names) as (urls, secret, procs):
        coord = Coordinator(urls, mc=3.0, admin_token=secret, health_failures=2)
        w0 = {"a": np.zeros(256, np.float32), "b": np.zeros((4, 8), np.float32)}
        rng = np.random.default_rng(7)
        with control_client(coord, secret, tick_s=0.05) as api:
            r = realgw.create_job(
                api, w0, job="fail", rounds=1, goal=8, clients=12, overprovision=1.125
            )
            tokens = r.json()["tokens"]
            rnd = r.json()["round"]
            # BestFit, MC = 3: nine selected clients fill the three nodes
            assert rnd["placement"] == "coordinator"
            assert rnd["clients_per_node"] == {"n1": 3, "n2": 3, "n3": 3}
            by_node: dict[str, list[str]] = {n: [] for n in names}
            for c in (f"c{i}" for i in range(12)):
                a = api.get("/v1/jobs/fail/assignment", params={"client": c})
                if a.status_code == 200:
                    by_node[a.json()["node"]].append(c)
            root = coord.jobs["fail"].root
            victim = next(n for n in names if n != root)
            sent: dict[str, list[tuple[dict[str, np.ndarray], int]]] = {n: [] for n in names}
            # two updates per node: each node's first leaf finishes, its middle waits for a third
            for node in names:
                for c in by_node[node][:2]:
                    t = {
                        "a": rng.standard_normal(256).astype(np.float32),
                        "b": rng.standard_normal((4, 8)).astype(np.float32),
                    }
                    w = int(rng.integers(1, 50))
                    res = realgw.upload(urls[node], "fail", 1, c, tokens[c], t, w)
                    assert res.status_code == 202, res.text
                    sent[node].append((t, w))
            wait_until(
                lambda: sum(api.get("/v1/jobs/fail").json()["round"]["received"].values()) == 6, 60
            )
            assert api.get("/v1/jobs/fail").json()["completed"] == 0  # goal 8 not reached

            realgw.kill(procs[victim])

            job = realgw.completed(api, "fail", 1, 60)
            nodes = {x["name"]: x["healthy"] for x in api.get("/v1/nodes").json()["nodes"]}
            assert nodes == {n: n != victim for n in names}
            h = job["history"][0]
            assert h["state"] == "closed" and h["published"]
            assert h["received"] == 4 and h["lost"] == 2
            assert h["closing"] == f"node_lost:{victim}"
            closed_with = job["round"]["closed_with"]
            assert victim not in closed_with and sum(closed_with.values()) == 4

            m = httpx.get(
                f"{urls[root]}/v1/jobs/fail/model", headers={"Authorization": f"Bearer {secret}"}
            )
            assert m.status_code == 200 and m.headers["x-model-version"] == "1"
            model = load(m.content)
            survivors = [u for n in names if n != victim for u in sent[n]]
            total = sum(w for _, w in survivors)
            for name in ("a", "b"):
                want = sum(w * t[name].astype(np.float64) for t, w in survivors) / total
                err = np.abs(model[name] - want).max() / np.abs(want).max()
                assert err <= 1e-6, err
            # a late upload to a survivor is refused: the round is over there
            late = by_node[root][2]
            res = realgw.upload(urls[root], "fail", 1, late, tokens[late], w0, 1)
            assert res.status_code == 409


def test_a_gateway_killed_before_the_others_got_updates_has_its_clients_placed_again(
    redis_url, tmp_path
):
    names = ("n1", "n2", "n3")
    with realgw.real_gateways(redis_url, tmp_path, names) as (urls, secret, procs):
        coord = Coordinator(urls, mc=3.0, admin_token=secret, health_failures=2)
        w0 = {"a": np.zeros(64, np.float32)}
        rng = np.random.default_rng(3)
        with control_client(coord, secret, tick_s=0.05) as api:
            r = realgw.create_job(
                api, w0, job="move", rounds=1, goal=4, clients=12, overprovision=2.25
            )
            tokens = r.json()["tokens"]
            assert r.json()["round"]["clients_per_node"] == {"n1": 3, "n2": 3, "n3": 3}
            root = coord.jobs["move"].root
            victim = next(n for n in names if n != root)
            first = {}
            for c in (f"c{i}" for i in range(12)):
                a = api.get("/v1/jobs/move/assignment", params={"client": c})
                if a.status_code == 200:
                    first[c] = a.json()["node"]
            lost_client = next(c for c, n in first.items() if n == victim)
            t = {"a": rng.standard_normal(64).astype(np.float32)}
            assert (
                realgw.upload(
                    urls[victim], "move", 1, lost_client, tokens[lost_client], t, 5
                ).status_code
                == 202
            )
            wait_until(
                lambda: api.get("/v1/jobs/move").json()["round"]["received"].get(victim) == 1, 60
            )

            realgw.kill(procs[victim])

            wait_until(
                lambda: victim not in api.get("/v1/jobs/move").json()["round"]["clients_per_node"],
                60,
            )
            rnd = api.get("/v1/jobs/move").json()["round"]
            assert rnd["lost"] == 1 and rnd["state"] == "open" and rnd["placement"] == "coordinator"
            sent = []
            for c in first:
                if c == lost_client or len(sent) == 4:
                    continue
                a = api.get("/v1/jobs/move/assignment", params={"client": c}).json()
                assert a["node"] != victim
                t = {"a": rng.standard_normal(64).astype(np.float32)}
                w = int(rng.integers(1, 20))
                res = realgw.upload(a["gateway_url"], "move", 1, c, tokens[c], t, w)
                assert res.status_code == 202, res.text
                sent.append((t, w))
            job = realgw.completed(api, "move", 1, 60)
            h = job["history"][0]
            assert h["state"] == "closed" and h["received"] == 4 and h["lost"] == 1
            m = httpx.get(
                f"{urls[root]}/v1/jobs/move/model", headers={"Authorization": f"Bearer {secret}"}
            )
            model = load(m.content)
            total = sum(w for _, w in sent)
            want = sum(w * t["a"].astype(np.float64) for t, w in sent) / total
            assert np.abs(model["a"] - want).max() / np.abs(want).max() <= 1e-6


@pytest.mark.slow  # over 5 s: `make test-slow`
@pytest.mark.parametrize("survivors_done", [False, True], ids=["leaf-done", "middle-done"])
def test_the_root_node_killed_mid_round_another_takes_the_job_over_and_nothing_is_lost(
    redis_url, tmp_path, survivors_done
):
    """The root gateway dies with the global model, the top and two accepted updates. Another
    node adopts the job (the model it fetched, the journal), the two clients are told to send
    again, the survivors' finished partials go to the new top, and rounds 1 and 2 are exactly
    the FedAvg of every acknowledged update, each counted once.

    ``middle-done``: every update of the surviving nodes arrived before the kill, so their
    middles finished; the dead root's clients moved onto them go under new middles
    (``control_plane.planning.replan`` rule 5)."""
    names = ("n1", "n2", "n3")
    with realgw.real_gateways(redis_url, tmp_path, names) as (urls, secret, procs):
        coord = Coordinator(urls, mc=3.0, admin_token=secret, health_failures=2)
        w0 = {"a": np.zeros(256, np.float32), "b": np.zeros((4, 8), np.float32)}
        rng = np.random.default_rng(11)

        def update() -> tuple[dict[str, np.ndarray], int]:
            t = {
                "a": rng.standard_normal(256).astype(np.float32),
                "b": rng.standard_normal((4, 8)).astype(np.float32),
            }
            return t, int(rng.integers(1, 50))

        def fedavg(sent):  # type: ignore[no-untyped-def]
            total = sum(w for _, w in sent)
            return {
                k: sum(w * t[k].astype(np.float64) for t, w in sent) / total for k in ("a", "b")
            }

        def assert_model(url, version, sent):  # type: ignore[no-untyped-def]
            m = httpx.get(
                f"{url}/v1/jobs/root/model", headers={"Authorization": f"Bearer {secret}"}
            )
            assert m.status_code == 200 and m.headers["x-model-version"] == str(version)
            model, want = load(m.content), fedavg(sent)
            for k in ("a", "b"):
                assert np.abs(model[k] - want[k]).max() / np.abs(want[k]).max() <= 1e-6

        with control_client(coord, secret, tick_s=0.05) as api:
            r = realgw.create_job(
                api, w0, job="root", rounds=2, goal=9, clients=9, overprovision=1.0
            )
            tokens = r.json()["tokens"]
            assert r.json()["round"]["clients_per_node"] == {"n1": 3, "n2": 3, "n3": 3}
            by_node: dict[str, list[str]] = {n: [] for n in names}
            for c in tokens:
                by_node[
                    api.get("/v1/jobs/root/assignment", params={"client": c}).json()["node"]
                ].append(c)
            root = coord.jobs["root"].root
            sent: dict[str, tuple[dict[str, np.ndarray], int]] = {}
            early = 3 if survivors_done else 2
            for node in names:  # each node's first leaf finishes (middle-done: its middle too)
                for c in by_node[node][: 2 if node == root else early]:
                    sent[c] = update()
                    res = realgw.upload(urls[node], "root", 1, c, tokens[c], *sent[c])
                    assert res.status_code == 202, res.text
            wait_until(
                lambda: (
                    sum(api.get("/v1/jobs/root").json()["round"]["received"].values())
                    == 2 + 2 * early
                ),
                60,
            )
            if survivors_done:  # both middles sent their partial to the root before it dies
                for node in names:
                    if node != root:
                        wait_until(lambda n=node: middles_done(urls[n], secret), 60)

            realgw.kill(procs[root])

            # the root changes first; the dead node's clients move an instant later (same step)
            view = wait_until(
                lambda: (
                    (j := api.get("/v1/jobs/root").json())["root"] != root
                    and root not in j["round"]["clients_per_node"]
                    and j
                ),
                60,
            )
            heir = view["root"]
            rnd = view["round"]
            assert rnd["takeovers"] == 1 and rnd["state"] == "open" and rnd["lost"] == 0
            assert rnd["resend"] == {c: 1 for c in by_node[root][:2]}
            assert root not in rnd["clients_per_node"]
            st = httpx.get(
                f"{urls[heir]}/v1/jobs/root", headers={"Authorization": f"Bearer {secret}"}
            )
            assert st.json()["version"] == 0
            # the moved clients' leaves: under a second middle where the first one finished
            second = {f"{n}:middle:1" for n in names if n != root and survivors_done}
            wait_until(lambda: root not in str(coord.plans["root"].aggregators()), 60)
            assert second == {
                s.id for s in coord.plans["root"].aggregators() if s.id.endswith(":middle:1")
            }
            # the dead node comes back, empty (its supervisor restarts it): its journaled plan
            # had the top, so it waits for the control plane's plan instead of taking uploads
            # into slots of its own; a client that still thinks it uploads there is refused
            # (before the fix it was acknowledged there and never aggregated)
            realgw.respawn(procs, root, tmp_path / f"{root}.log")
            moved = by_node[root][2]
            stale = realgw.upload(urls[root], "root", 1, moved, tokens[moved], *update())
            assert stale.status_code == 409, stale.text
            assert stale.json()["error"] in ("round_not_open", "wrong_node"), stale.text
            wait_until(lambda: coord.nodes[root].healthy, 60)
            # the two clients are told to send again, to a surviving node; then the last ones
            late = [by_node[n][2] for n in names if n == root or not survivors_done]
            for c in [*by_node[root][:2], *late]:
                a = api.get("/v1/jobs/root/assignment", params={"client": c}).json()
                assert a["node"] != root
                assert a["resend"] == (1 if c in by_node[root][:2] else 0)
                sent.setdefault(c, update())
                res = realgw.upload(a["gateway_url"], "root", 1, c, tokens[c], *sent[c])
                assert res.status_code == 202, res.text
                if a["resend"]:  # counted once: a second send is a duplicate
                    again = realgw.upload(a["gateway_url"], "root", 1, c, tokens[c], *sent[c])
                    assert again.status_code == 409 and again.json()["error"] == "duplicate_client"
            # and round 2's plan pushed (the control plane counts the close before it opens
            # the next round: an assignment between the two is refused)
            job = realgw.completed(api, "root", 1, 60, next_open=True)
            h = job["history"][0]
            assert h["state"] == "closed" and h["published"]
            # "received" is what the polls saw: it may miss the last updates before publication
            assert h["aggregated"] == 9 and h["received"] <= 9 and h["lost"] == 0
            assert_model(urls[heir], 1, list(sent.values()))

            # round 2 runs on the new root from start to end, the old one a member again
            sent2 = {}
            for c in tokens:
                a = api.get("/v1/jobs/root/assignment", params={"client": c}).json()
                assert a["round"] == 2 and a["resend"] == 0  # n1 is back in placement
                sent2[c] = update()
                until = time.monotonic() + 60
                while True:  # that node follows the new root's publication in a moment
                    res = realgw.upload(a["gateway_url"], "root", 2, c, tokens[c], *sent2[c])
                    if res.status_code != 409 or res.json()["error"] != "round_not_open":
                        break
                    assert time.monotonic() < until
                    time.sleep(0.05)
                assert res.status_code == 202, res.text
            job = realgw.completed(api, "root", 2, 60)
            assert job["done"] and job["history"][1]["aggregated"] == 9
            assert_model(urls[heir], 2, list(sent2.values()))

            # the adopt route: admin only, a body naming the dead root, once
            other = next(n for n in names if n not in (root, heir))
            adopt = f"{urls[other]}/v1/jobs/root/adopt"
            assert httpx.post(adopt, json={"from": heir}).status_code == 401
            admin = {"Authorization": f"Bearer {secret}"}
            for bad in ({}, {"from": 3}, {"from": "n9"}, {"from": other}, [heir]):
                res = httpx.post(adopt, json=bad, headers=admin)
                assert res.status_code == 422 and res.json()["error"] == "bad_adopt", res.text
            res = httpx.post(adopt, json={"from": root}, headers=admin)  # n1 is not the root now
            assert res.status_code == 409 and res.json()["error"] == "not_root", res.text
