"""Async (FedBuff) clients refused with a 409 never wait for a version that only their own
updates could bring, against two real gateway processes (issue 35: the async bench's stall in
CI showed every simulated client waiting after a 409, two with their update in the open
buffer, and the version never moving; both ways below end there on the old simulator).

The control plane's part is played by the test with what it sends: the round plans its own
planner builds (``plan_hierarchy``, the top on the root ``n1``, ``plan_to_slots``) pushed to
both gateways, and each client's node for the open round (the simulator's assignment
callable, as ``GET /v1/jobs/{job}/assignment`` answers). Each test holds that part back at
one named point, the one where the old simulator's clients were all waiting:

- a round waits for the control plane's plan (every upload 409 ``round_not_open``) longer
  than the SDK's retries last: the plan comes once every client gave up on the round. It
  opens with no new version, so a client waiting for one waited for ever;
- the control plane plans each round's share of the buffer per node from that round's
  placement, and an async client's update lands in a round after the one it was placed
  for: the next round's placement moved to ``n2``, and ``n1``, where every client sends,
  has no share of it (409 ``round_full``). The placement moves once ``n1`` refused them
  all; the version they waited for could only come from ``n2``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import client.simulator
from client.control import ASYNC_KEY, with_metadata
from client.data import FederatedDigits, federated_digits
from client.errors import StaleRound
from client.model import make_model, model_to_bytes
from client.node import FLClient, JobCreated, UploadReceipt
from client.sdk import create_job
from client.simulator import RoundReport, Simulator, SimulatorConfig
from control_plane.gateways import plan_to_slots
from control_plane.planning import plan_hierarchy
from tests.dataplane.twonodes import TwoNodes, two_nodes
from tests.polling import wait_until

pytestmark = pytest.mark.integration

GOAL = 2  # the buffer: K updates over both nodes
JOB = "buffered"
#: how long the SDK sends again after 409 ``round_not_open`` here (30 s by default)
NOT_OPEN_WAIT_S = 1.0


def _round_plan(node: str, version: int, clients: list[str]) -> dict[str, Any]:
    """The slot table the control plane pushes for a round whose clients it placed on
    ``node``: that node's share is the whole buffer, the top on the root ``n1``."""
    plan = dataclasses.replace(plan_hierarchy({node: GOAL}, version=version), top_node="n1")
    return plan_to_slots(plan, dict.fromkeys(clients, node))


def _push(nodes: TwoNodes, rnd: int, slots: Mapping[str, Any]) -> None:
    """To ``n2``, then the root ``n1`` (a round the root publishes at once is over on ``n2``
    before its plan would come)."""
    for n in ("n2", "n1"):
        r = httpx.put(
            f"{nodes.url(n)}/v1/jobs/{JOB}/rounds/{rnd}/plan",
            json=slots,
            headers=nodes.admin(),
            timeout=10,
        )
        assert r.status_code == 200, (n, rnd, r.text)


class Refusals:
    """Every 409 the simulated clients were answered, as ``(client, gateway URL, code)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, str]] = []

    def by(self, url: str, code: str) -> list[str]:
        """The clients ``url`` refused with ``code``, once per refusal."""
        with self.lock:
            return [c for c, u, e in self.seen if u == url and e == code]


@pytest.fixture()
def refusals(monkeypatch: pytest.MonkeyPatch) -> Refusals:
    """The simulator's clients are the SDK's, noting each refusal they raise (what the named
    points wait for) and sending again after ``round_not_open`` for ``NOT_OPEN_WAIT_S``."""
    seen = Refusals()

    class RecordingClient(FLClient):
        def upload(self, round: int, *args: Any, **kw: Any) -> UploadReceipt:  # noqa: A002
            try:
                return super().upload(round, *args, not_open_wait=NOT_OPEN_WAIT_S, **kw)
            except StaleRound as exc:
                with seen.lock:
                    seen.seen.append((self.client_id, self.gateway_url, exc.error))
                raise

    monkeypatch.setattr(client.simulator, "FLClient", RecordingClient)
    return seen


@contextmanager
def _async_job(tmp_path: Path, redis_url: str) -> Iterator[tuple[TwoNodes, JobCreated, list[str]]]:
    """Two gateways and an async job of 3 clients, a buffer of 2 and 2 versions, its round 1
    planned by the control plane with every client on ``n1``."""
    with two_nodes(tmp_path, redis_url) as nodes:
        ids = [c.client_id for c in _data().clients]
        weights = with_metadata(model_to_bytes(make_model(0, "softmax")), {ASYNC_KEY: "{}"})
        job = create_job(
            nodes.url("n1"),
            nodes.secret,
            JOB,
            weights,
            rounds=2,
            goal=GOAL,
            clients=ids,
            nodes=["n1", "n2"],
        )
        wait_until(lambda: nodes.status("n2", JOB), 30, f"node n2 loads {JOB}")
        _push(nodes, 1, _round_plan("n1", 1, ids))
        yield nodes, job, ids


def _data() -> FederatedDigits:
    return federated_digits(3, alpha=0.5, seed=0)


def _run(job: JobCreated, where: Callable[[str], str] | Mapping[str, str]) -> list[RoundReport]:
    cfg = SimulatorConfig(rounds=2, workers=3, model="softmax", round_timeout=20.0)
    with Simulator(JOB, _data(), job.tokens, where, cfg) as sim:
        return sim.run_async()


def test_a_round_whose_plan_comes_after_every_client_gave_up_on_it_still_fills(
    tmp_path: Path, redis_url: str, refusals: Refusals
) -> None:
    with _async_job(tmp_path, redis_url) as (nodes, job, ids):
        n1 = nodes.url("n1")
        planned: list[BaseException | None] = []

        def control_plane() -> None:
            """Round 2's plan, once every client gave up on round 2 (not open on n1)."""
            try:
                wait_until(
                    lambda: set(refusals.by(n1, "round_not_open")) == set(ids),
                    60,
                    "every client gives up on round 2, which waits for its plan",
                )
                _push(nodes, 2, _round_plan("n1", 2, ids))
                planned.append(None)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                planned.append(exc)

        late = threading.Thread(target=control_plane, daemon=True)
        late.start()
        reports = _run(job, dict.fromkeys(ids, n1))
        late.join(60)
        assert planned == [None]  # the named point was reached
        assert [r.version for r in reports] == [1, 2]


def test_clients_refused_where_the_next_round_has_no_share_send_where_it_moved(
    tmp_path: Path, redis_url: str, refusals: Refusals
) -> None:
    with _async_job(tmp_path, redis_url) as (nodes, job, ids):
        # round 2, pushed ahead as the control plane does for the next round, placed on n2
        _push(nodes, 2, _round_plan("n2", 2, ids))
        n1 = nodes.url("n1")
        # n1 refuses one of the three in round 1 (its share of 2 is full), then each of them
        # once in round 2 (no share): the round-2 refusals find every client waiting
        point = 1 + len(ids)

        def placed(client_id: str) -> str:
            """The control plane's answer: n1 until the named point (it saw version 1 late),
            then round 2's placement, n2."""
            moved = len(refusals.by(n1, "round_full")) >= point
            return nodes.url("n2" if moved else "n1")

        reports = _run(job, placed)
        assert [r.version for r in reports] == [1, 2]
        refused = refusals.by(n1, "round_full")  # the named point was reached
        assert len(refused) >= point and set(refused) == set(ids), refusals.seen
