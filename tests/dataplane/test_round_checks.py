"""Which 409 an upload for a round other than the open one gets, before its body is read: on
a node that follows the job's root, the next round is "not open yet" (the root published and
opened it; this node catches up from the journal in a moment, and the SDK sends again), while
on the root, or further ahead, it is a ``future_round`` (final). Found by the soak: clients
sent by the control plane to a follower a moment early were refused for good."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import UpdateRejected
from gateway.jobs import Job
from gateway.plan import static_plan


def _job(node: str) -> Job:
    clients = ["a", "b", "c", "d"]
    plan = static_plan(4, clients, ["n1", "n2"])
    # the round checks read neither the model spec nor the store
    spec: Any = None
    return Job("j", 1, spec, 5, 4, clients, ["n1", "n2"], plan, spec, node, version=3)


@pytest.mark.parametrize(
    "node,rnd,code",
    [
        ("n2", 5, "round_not_open"),  # the follower, the round after its open one (4)
        ("n2", 6, "future_round"),
        ("n2", 3, "stale_round"),
        ("n1", 5, "future_round"),  # the root opens rounds itself: nothing to wait for
        ("n1", 3, "stale_round"),
    ],
)
def test_an_upload_for_another_round_gets_its_409(node: str, rnd: int, code: str) -> None:
    job = _job(node)
    client = next(c for c, n in job.plan.client_nodes.items() if n == node)
    with pytest.raises(UpdateRejected) as err:
        job.check_round(rnd, client, node)
    assert (err.value.status, err.value.code) == (409, code)
