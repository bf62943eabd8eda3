"""What a node gateway keeps does not grow with a job's rounds, and a deleted job leaves nothing
on a node that missed its deletion.

- Many rounds: the background tasks held are those in flight (done ones are let go), and a
  job keeps the times of its last ``round_times_kept`` rounds.
- A job deleted on its root while another node could not be told (the control plane reached
  only the root): that node forgets it at its next journal read and frees its store.
- A job deleted while one of its nodes was down (its store left behind): that node, started
  again, removes the store.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, settings
from tests.dataplane.rounds import create, upload
from tests.polling import wait_until

pytestmark = pytest.mark.integration

ROUNDS, KEPT = 30, 4


def test_a_job_of_many_rounds_keeps_its_tasks_and_round_times_bounded(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3, round_times_kept=KEPT)
    clients = ["c0", "c1", "c2"]
    info = create(gw, clients, 3, rounds=ROUNDS)
    job = gw.gw.jobs["j1"]
    tasks = gw.gw.background.tasks
    aggs = Aggregators(gw)
    held: list[int] = []
    try:
        aggs.start(2)
        for rnd in range(1, ROUNDS + 1):
            for i, c in enumerate(clients):
                upload(gw.url, info["tokens"], c, rnd, rnd * 10 + i, i + 1)
            wait_until(lambda r=rnd: job.version >= r, 60, f"round {rnd} published")
            held.append(len(tasks))
        assert job.open_round is None and len(job.times) == KEPT
        assert [t.round for t in job.times] == list(range(ROUNDS - KEPT + 1, ROUNDS + 1))
        wait_until(lambda: len(tasks) == 1, 30, "only the housekeeping loop left")
        assert max(held) <= 8, held  # what is in flight at a round's end, not what ever ran
        assert job.ns.keys() == [job.global_key.hex()]
    finally:
        aggs.stop()


def _two(make_gw, tmp_path: Path, **b_settings: object):  # type: ignore[no-untyped-def]
    shared = tmp_path / "admin-secret"
    a = make_gw(node="a", fanout=2, pool=3, admin_secret_file=shared)
    b = make_gw(
        node="b", fanout=2, pool=3, peers={"a": a.url}, admin_secret_file=shared, **b_settings
    )
    create(a, ["c0", "c1"], 2, nodes="a,b")
    wait_until(lambda: "j1" in b.gw.jobs, 30, "node b loads the job")
    store = b.gw.jobs["j1"].ns.path
    assert store.is_dir()
    return a, b, store


def _delete_on(gw: GatewayThread) -> None:
    r = httpx.delete(gw.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"})
    assert r.status_code == 204, r.text


def test_a_job_deleted_on_its_root_alone_is_forgotten_by_its_other_node(
    make_gw, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    a, b, store = _two(make_gw, tmp_path)
    _delete_on(a)  # the control plane could not reach b: only the root was told
    # the node drops the job from its table, then closes its store (membership._forget, on
    # its event loop while this thread reads): both are waited for
    wait_until(
        lambda: "j1" not in b.gw.jobs and not store.exists(),
        30,
        "node b forgets the deleted job and removes its store",
    )
    r = httpx.get(b.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {b.gw.secret}"})
    assert r.status_code == 404 and r.json()["error"] == "unknown_job"


def test_a_job_deleted_while_its_node_was_down_leaves_no_store_there(
    make_gw, tmp_path: Path, redis_url: str
) -> None:  # type: ignore[no-untyped-def]
    a, b, store = _two(make_gw, tmp_path)
    b.stop()  # its store stays for its next start, as after a crash
    assert store.is_dir()
    _delete_on(a)
    again = GatewayThread(
        settings(
            tmp_path,
            redis_url,
            node="b",
            fanout=2,
            pool=3,
            peers={"a": a.url},
            admin_secret_file=tmp_path / "admin-secret",
            shm_root=b.settings.shm_root,
        )
    ).start()
    try:
        assert "j1" not in again.gw.jobs
        assert not store.exists()
    finally:
        again.stop()
    assert not b.settings.shm_root.exists()
