"""The practitioner's side on ``fedfaas up --with all`` (issue 42), one platform for the module:

* a job run to its end through the handle: the final model read after the end equals the last
  round's FedAvg, from the handle and from a client's assignment; a query through the handle;
* four Flower clients, one raising in ``fit`` in round 2: round 2 closes at once with the
  other three under ``min_updates=3`` (its deadline is 600 s), the job finishes, and the
  adapter returns the error for that client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load, save

from client.errors import StaleRound
from client.flower import FlowerRound, flower_weights, run_numpy_client
from client.node import FLClient
from client.sdk import submit_job
from client.simulator import control_plane_assignment
from core import fedavg
from tests.platform.running import any_ports_env, running_platform

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Platform:
    state_dir: Path
    urls: dict[str, str]
    env: dict[str, str]

    def secret(self, name: str) -> str:
        return (self.state_dir / "secrets" / name).read_text().strip()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """``fedfaas up --with all`` on free ports in a state folder of its own."""
    state_dir = tmp_path_factory.mktemp("client-platform") / "state"
    env = any_ports_env()
    with running_platform(state_dir, "--with", "all", env=env, timeout=300) as st:
        urls = {name: f"http://{st.host}:{p}" for name, p in st.ports.items()}
        yield Platform(state_dir, urls, env)


SHAPES = {"w": (32, 8), "b": (8,)}


def _update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def test_a_job_through_its_handle_to_its_end_then_its_final_model_and_a_query(
    platform: Platform,
) -> None:
    admin = platform.secret("gateway-admin-secret")
    clients = [f"h{i}" for i in range(4)]
    job = submit_job(
        platform.urls["control_plane"],
        "handle",
        save({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}),
        rounds=2,
        goal=4,
        admin_token=admin,
        tracker_url=platform.urls["request_tracker"],
        analyst_token=platform.secret("analyst-token"),
    )
    assert job["enrollment_token"] and job["round"] is None  # waiting for its clients
    tokens = job.enroll(clients)
    last: tuple[list[dict[str, np.ndarray]], list[int]] = ([], [])
    for rnd in (1, 2):
        last = ([], [])
        for i, c in enumerate(clients):
            with job.client(c, round=rnd) as fl:
                fl.wait_for_version(rnd - 1)
                u, n = _update(100 * rnd + i), 1 + (rnd + i) % 5
                fl.upload(rnd, u, num_samples=n)  # numpy arrays: no torch needed
            last[0].append(u)
            last[1].append(n)
        assert job.wait(rnd)["state"] == "closed"
    final_view = job.wait()
    assert final_view["done"] and final_view["completed"] == 2
    assert [(h["round"], h["state"], h["failures"]) for h in job.history()] == [
        (1, "closed", {}),
        (2, "closed", {}),
    ]
    # after the end: the final model from the handle, and from where a client is sent
    final = job.model()
    assert final.version == 2
    got = load(final.data)
    for k in SHAPES:
        want = fedavg.fedavg_reference([u[k] for u in last[0]], last[1])
        assert fedavg.rel_error(got[k], want) <= 1e-6, k
    a = job.assignment("h3")
    assert a.done and a.round == 2
    url = control_plane_assignment(platform.urls["control_plane"], "handle", tokens)("h3")
    assert url == a.gateway_url
    with FLClient(url, "handle", "h3", tokens["h3"]) as fl:
        assert fl.fetch_model().data == final.data
    with pytest.raises(StaleRound):  # round 2 is over
        job.client("h3", round=2)
    krum = job.query("multi-krum", rounds=[2], params={"f": 1})
    assert set(krum["result"]["scores"]) == set(clients)


class FlakyClient:
    """A Flower ``NumPyClient`` whose fit adds a fixed step per client and round; the one
    made with ``fail_in`` raises in that round's fit."""

    def __init__(self, index: int, fail_in: int | None = None) -> None:
        self.index, self.fail_in = index, fail_in

    def step(self, rnd: int) -> np.ndarray:
        return np.full(6, (self.index + 1) * rnd, np.float32)

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return [np.zeros(6, np.float32)]

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[Any, int, dict]:
        rnd = int(config["server_round"])
        if rnd == self.fail_in:
            raise RuntimeError(f"client {self.index} ran out of memory in round {rnd}")
        return [parameters[0] + self.step(rnd)], 10 + self.index, {}

    def evaluate(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[float, int, dict]:
        return float(np.abs(parameters[0]).mean()), 5, {}


def test_a_flower_client_that_raises_in_round_2_leaves_it_and_the_others_go_on(
    platform: Platform,
) -> None:
    flwr = pytest.importorskip("flwr.client")  # the real NumPyClient base, when installed

    class Flaky(FlakyClient, flwr.NumPyClient):  # type: ignore[misc, name-defined]
        pass

    admin = platform.secret("gateway-admin-secret")
    flakies = [Flaky(i, fail_in=2 if i == 3 else None) for i in range(4)]
    cp = platform.urls["control_plane"]
    job = submit_job(
        cp,
        "flaky",
        flower_weights(flakies[0].get_parameters({})),
        rounds=3,
        clients=[f"f{i}" for i in range(4)],
        min_updates=3,
        deadline_s=600.0,  # round 2 must not wait for it: every wait below is shorter
        admin_token=admin,
    )
    results: dict[str, list[FlowerRound]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        cid = f"f{i}"
        try:
            results[cid] = run_numpy_client(flakies[i], cp, "flaky", cid, job.tokens[cid])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors and not any(t.is_alive() for t in threads), errors
    # the adapter returns the error for that client, and it trained in the other rounds
    mine = {r.round: r for r in results["f3"]}
    assert sorted(mine) == [1, 2, 3]
    assert isinstance(mine[2].error, RuntimeError) and "round 2" in str(mine[2].error)
    assert mine[1].error is None and mine[3].error is None
    assert all(r.error is None for c in ("f0", "f1", "f2") for r in results[c])
    view = job.wait(timeout=60)
    h = {r["round"]: r for r in view["history"]}
    # closed on the goal path (the gateways' plans wanted 4: they aggregated the 3 they held)
    assert (h[2]["state"], h[2]["received"], h[2]["closing"]) == ("closed", 3, "goal")
    assert h[2]["failures"] == {"f3": "RuntimeError: client 3 ran out of memory in round 2"}
    assert h[1]["state"] == h[3]["state"] == "closed" and not h[1]["failures"] | h[3]["failures"]
    # the final model is Flower's FedAvg, round 2 without f3
    g = np.zeros(6, np.float64)
    for rnd in (1, 2, 3):
        fits = [f for f in flakies if not (rnd == 2 and f.fail_in == 2)]
        g = fedavg.fedavg_reference([g + f.step(rnd) for f in fits], [10 + f.index for f in fits])
    got = load(job.model().data)["00000"]
    assert fedavg.rel_error(got, g) <= 1e-6
