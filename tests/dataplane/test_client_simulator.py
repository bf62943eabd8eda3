"""Client simulator against a real node gateway (the demo itself: tests/demo/)."""

from __future__ import annotations

import pytest

from client.control import ASYNC_KEY, with_metadata
from client.data import federated_digits
from client.model import make_model, model_to_bytes
from client.sdk import create_job
from client.simulator import Simulator, SimulatorConfig, assignment_from_plan, round_robin
from fedfaas.demo import fedavg_error
from tests.dataplane.test_client_sdk import gateway  # noqa: F401 - fixture


def test_round_robin_and_plan_assignments_cover_every_client() -> None:
    ids = [f"c{i}" for i in range(5)]
    assert round_robin(ids, ["u0", "u1"]) == {
        "c0": "u0",
        "c1": "u1",
        "c2": "u0",
        "c3": "u1",
        "c4": "u0",
    }
    plan = {"c0": "a", "c1": "b"}
    assert assignment_from_plan(plan, {"a": "ua", "b": "ub"}) == {"c0": "ua", "c1": "ub"}
    with pytest.raises(ValueError, match="no gateway URL"):
        assignment_from_plan(plan, {"a": "ua"})


def test_a_callable_assignment_is_asked_again_and_moved_clients_reconnect() -> None:
    data = federated_digits(4, seed=0)
    ids = [c.client_id for c in data.clients]
    where = dict.fromkeys(ids, "http://127.0.0.1:1")
    with Simulator("j", data, dict.fromkeys(ids, "t"), where.__getitem__) as sim:
        before = dict(sim.clients)
        where[ids[0]] = "http://127.0.0.1:2"
        sim._assign()
        assert sim.gateway_of[ids[0]] == "http://127.0.0.1:2"
        assert sim.clients[ids[0]] is not before[ids[0]]
        assert sim.clients[ids[1]] is before[ids[1]]
        assert sim.clients[ids[0]].gateway_url == "http://127.0.0.1:2"


@pytest.mark.integration
def test_simulated_clients_learn_through_the_gateway_and_the_model_is_exact_fedavg(
    gateway: tuple[str, str],  # noqa: F811
) -> None:
    url, admin = gateway
    data = federated_digits(6, alpha=0.5, seed=0)
    ids = [c.client_id for c in data.clients]
    job = create_job(
        url, admin, "sim", model_to_bytes(make_model(0)), rounds=3, goal=6, clients=ids
    )
    uploads: dict[tuple[int, str], bytes] = {}
    served: dict[int, bytes] = {}

    def hook(kind: str, info: dict) -> None:  # type: ignore[type-arg]
        if kind == "upload":
            uploads[info["round"], info["client"]] = info["data"]
        else:
            served[info["round"]] = info["global_model"]

    cfg = SimulatorConfig(rounds=3, workers=2)
    with Simulator("sim", data, job.tokens, round_robin(ids, [url]), cfg, on_event=hook) as sim:
        start_acc, _ = sim.evaluate_bytes(model_to_bytes(make_model(0)))
        reports = sim.run()
    assert [r.round for r in reports] == [1, 2, 3]
    assert [r.version for r in reports] == [1, 2, 3]
    assert all(r.accepted == 6 and r.late == 0 for r in reports)
    assert reports[-1].accuracy > max(0.3, start_acc + 0.15)
    samples = {c.client_id: c.num_samples for c in data.clients}
    for rnd, blob in served.items():
        err = fedavg_error(blob, [(b, samples[c]) for (r, c), b in uploads.items() if r == rnd])
        assert err < 1e-5


@pytest.mark.integration
def test_an_async_job_that_publishes_no_version_is_reported_node_by_node_and_client_by_client(
    gateway: tuple[str, str],  # noqa: F811
) -> None:
    """Two of an async job's three clients run; its buffer of 3 never fills, so no version
    comes: ``run_async`` raises ``TimeoutError`` after ``round_timeout`` s saying what the
    node holds (2 accepted of 3) and what each client is doing (its update is in: it waits for
    the version the buffer would publish)."""
    url, admin = gateway
    data = federated_digits(2, alpha=0.5, seed=0)
    ids = [c.client_id for c in data.clients]
    weights = with_metadata(model_to_bytes(make_model(0, "softmax")), {ASYNC_KEY: "{}"})
    job = create_job(url, admin, "stall", weights, rounds=2, goal=3, clients=[*ids, "absent"])
    cfg = SimulatorConfig(rounds=1, workers=2, model="softmax", round_timeout=3.0)
    with (
        Simulator("stall", data, job.tokens, dict.fromkeys(ids, url), cfg) as sim,
        pytest.raises(TimeoutError) as stalled,
    ):
        sim.run_async()
    said = str(stalled.value)
    assert "stall: no new version for 3 s (version 0 of 1)" in said, said
    assert '"accepted": 2' in said and '"capacity": 3' in said, said
    for c in ids:
        assert f'"{c}": "waits for version 1"' in said, said
