"""The platform a user starts, end to end: ``fedfaas up --with all``, jobs through the control
plane, clients through the SDK, and aggregation only in replicas of the ``aggregator``
function, which the gateways grant jobs (LIFL's reuse) and the control plane scales.

One platform serves the whole module, in the order of the tests: a fresh platform has the
function at its minimum (one replica), so the first test is the one about scaling up.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load, save

from client.sdk import FLClient
from core import fedavg
from fedfaas.platform import credentials, state
from tests.commands import run_module
from tests.platform.running import any_ports_env, fedfaas, running_platform
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
SHAPES = {"w": (64, 32), "b": (32,)}

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`


@dataclass
class Platform:
    """What the tests need of the running platform: its addresses and the admin's secrets."""

    state_dir: Path
    urls: dict[str, str]  # part port name -> URL
    #: job -> client -> bearer token, from the control plane's answer to the job's creation
    tokens: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def runtime_auth(self) -> tuple[str, str]:
        return credentials.basic_auth(self.state_dir / "secrets")

    @property
    def admin_secret(self) -> str:
        return (self.state_dir / "secrets" / "gateway-admin-secret").read_text().strip()

    @property
    def admin(self) -> dict[str, str]:
        """The gateways' admin bearer header (``/v1/router``, job progress)."""
        return {"Authorization": f"Bearer {self.admin_secret}"}

    @property
    def gateways(self) -> dict[str, str]:
        return {"node0": self.urls["gateway"], "node1": self.urls["gateway_node1"]}

    def replicas(self, ready: bool = True, function: str = "aggregator") -> list[dict[str, Any]]:
        """``GET /system/replicas/<function>`` on the runtime: the function's replicas, ready
        ones only or all (a starting replica registers its endpoints before it is ready)."""
        r = httpx.get(
            f"{self.urls['runtime']}/system/replicas/{function}",
            auth=self.runtime_auth,
            timeout=10,
        )
        r.raise_for_status()
        return [x for x in r.json() if x["state"] == "ready" or not ready]

    def endpoint_pids_are_replicas(self) -> None:
        """Every router endpoint is a replica of the function, on the node it is placed on
        (endpoints read first: a replica they name already exists when the replicas are read)."""
        endpoints = self.endpoints()
        reps = self.replicas(ready=False)
        for node, eps in endpoints.items():
            assert {e["pid"] for e in eps} <= {r["pid"] for r in reps if r["node"] == node}

    def endpoints(self) -> dict[str, list[dict[str, Any]]]:
        """Each node's registered function endpoints (``/v1/router``, local ones left out)."""
        return {
            node: [
                e
                for e in httpx.get(f"{url}/v1/router", headers=self.admin, timeout=10).json()[
                    "endpoints"
                ]
                if not e["local"]
            ]
            for node, url in self.gateways.items()
        }

    def replica_status(self, rep: dict[str, Any]) -> dict[str, Any]:
        """A replica's own status (``GET /`` on its port, with the function token)."""
        token = credentials.read(self.state_dir / "secrets", credentials.FUNCTION_TOKEN)
        r = httpx.get(
            f"http://127.0.0.1:{rep['port']}/",
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        )
        r.raise_for_status()
        return dict(r.json())

    def tasks_done(self) -> dict[int, int]:
        """Slots each replica has aggregated, by pid, from the replica's own status."""
        out = {}
        for rep in self.replicas():
            st = self.replica_status(rep)
            out[rep["pid"]] = sum(e["tasks_done"] for e in st["endpoints"])
        return out

    def scale(self, replicas: int) -> None:
        r = httpx.post(
            f"{self.urls['runtime']}/system/scale-function/aggregator",
            json={"serviceName": "aggregator", "replicas": replicas},
            auth=self.runtime_auth,
            timeout=10,
        )
        assert r.status_code < 300, r.text

    def create_job(self, job: str, clients: list[str], rounds: int, per_leaf: int = 2) -> None:
        """``POST /v1/jobs`` on the control plane: every selected client, goal = all of them,
        spread over both nodes (``leastconn``; ``bestfit`` packs a small job on one node).
        The clients' tokens from the answer go to :attr:`tokens`."""
        w0 = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
        r = httpx.post(
            f"{self.urls['control_plane']}/v1/jobs",
            json={
                "job": job,
                "rounds": rounds,
                "goal": len(clients),
                "clients": clients,
                "overprovision": 1.0,
                "per_leaf": per_leaf,
                "policy": "leastconn",
                "weights_b64": base64.b64encode(save(w0)).decode(),
            },
            headers={"Authorization": f"Bearer {self.admin_secret}"},
            timeout=60,
        )
        assert r.status_code == 201, r.text
        self.tokens[job] = r.json()["tokens"]

    def client(self, job: str, client: str) -> FLClient:
        """The SDK client of ``client``, connected to the gateway the control plane assigns."""
        token = self.tokens[job][client]
        a = httpx.get(  # as the client itself: its token opens its own assignment
            f"{self.urls['control_plane']}/v1/jobs/{job}/assignment",
            params={"client": client},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert a.status_code == 200, a.text
        return FLClient(a.json()["gateway_url"], job, client, token)

    def wait_open(self, job: str, rnd: int) -> None:
        """Until the control plane has round ``rnd`` of ``job`` open (assignments answer)."""

        def is_open() -> bool:
            r = httpx.get(
                f"{self.urls['control_plane']}/v1/jobs/{job}",
                headers={"Authorization": f"Bearer {self.admin_secret}"},
                timeout=10,
            ).json()
            cur = r.get("round") or {}
            return bool(cur.get("number") == rnd and cur.get("state") == "open")

        wait_until(is_open, 60, f"round {rnd} of {job} open on the control plane")

    def progress(self, job: str, node: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(
            f"{self.gateways[node]}/v1/jobs/{job}", headers=self.admin, timeout=10
        ).json()
        return body

    def root_client(self, job: str, client: str) -> FLClient:
        """An SDK client on the job's root gateway (node0: the control plane's first node)."""
        return FLClient(self.gateways["node0"], job, client, self.tokens[job][client])


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def make_update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def assert_fedavg(model: bytes, updates: list[dict[str, np.ndarray]], weights: list[int]) -> None:
    got = load(model)
    for k in SHAPES:
        want = fedavg.fedavg_reference([u[k] for u in updates], weights)
        assert fedavg.rel_error(got[k], want) <= 1e-6, k


@contextlib.contextmanager
def platform_up(state_dir: Path) -> Iterator[Platform]:
    """``fedfaas up --with all`` in ``state_dir`` on free ports; ``fedfaas down`` on exit."""
    # the control plane scales the function down after this many idle seconds
    env = any_ports_env(FEDFAAS_CONTROL_SCALE_DOWN_S="20")
    with running_platform(state_dir, "--with", "all", env=env, timeout=300) as st:
        yield Platform(state_dir, {name: f"http://{st.host}:{p}" for name, p in st.ports.items()})


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with platform_up(tmp_path_factory.mktemp("one-platform") / "state") as p:
        yield p


def run_round(
    p: Platform, job: str, clients: list[str], rnd: int, seed: int
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """Every client uploads its update for round ``rnd`` to its assigned gateway, once that
    gateway has the model of round ``rnd - 1`` (as a client trains on it first: a node gateway
    opens the next round when it sees the root's new model, a moment after the root)."""
    p.wait_open(job, rnd)
    updates, weights = [], []
    for i, c in enumerate(clients):
        u, w = make_update(seed + i), 1 + (seed + i) % 7
        with p.client(job, c) as fl:
            fl.wait_for_version(rnd - 1, timeout=120)
            fl.upload(rnd, save(u), w)
        updates.append(u)
        weights.append(w)
    return updates, weights


def test_a_round_of_20_updates_scales_the_function_up_and_a_new_replica_aggregates(
    platform: Platform,
) -> None:
    p = platform
    wait_until(lambda: len(p.replicas()) == 1, 60, "the function at its minimum of 1 replica")
    [first] = p.replicas()
    wait_until(lambda: sum(map(len, p.endpoints().values())) == 2, 60, "2 endpoints")
    clients = [f"s{i}" for i in range(20)]
    p.create_job("scale", clients, rounds=2)
    updates, weights = run_round(p, "scale", clients, 1, seed=100)
    with p.root_client("scale", "s0") as fl:
        model = fl.wait_for_version(1, timeout=120)
    assert_fedavg(model.data, updates, weights)
    started = p.replicas(ready=False)
    assert len(started) > 1, "the control plane scaled the function up"
    # A new replica registers its endpoints (and may aggregate) before the runtime's probe
    # marks it ready, so the round can end first; it is a replica once it is ready.
    reps = wait_until(
        lambda: [r for r in p.replicas() if r["pid"] != first["pid"]],
        60,
        "the new replica ready",
    )
    # the first round may end before the new replica registers (a loaded machine uploads
    # slowly); once its endpoints are there, the next round's work reaches it
    new_pids = {r["pid"] for r in reps}
    wait_until(
        lambda: new_pids & {e["pid"] for eps in p.endpoints().values() for e in eps},
        60,
        "the new replica's endpoints registered",
    )
    updates, weights = run_round(p, "scale", clients, 2, seed=200)
    with p.root_client("scale", "s0") as fl:
        assert_fedavg(fl.wait_for_version(2, timeout=120).data, updates, weights)
    done = p.tasks_done()
    new = {pid: n for pid, n in done.items() if pid != first["pid"]}
    assert any(n > 0 for n in new.values()), f"a new replica aggregated part: {done}"
    p.endpoint_pids_are_replicas()


def test_twelve_clients_two_nodes_three_rounds_aggregated_only_by_the_function(
    platform: Platform,
) -> None:
    p = platform
    clients = [f"c{i}" for i in range(12)]
    before = p.tasks_done()
    p.create_job("main", clients, rounds=3)
    placed: dict[str, int] = {}
    for rnd in (1, 2, 3):
        p.wait_open("main", rnd)
        for c in clients:
            with p.client("main", c) as fl:
                placed[fl.gateway_url] = placed.get(fl.gateway_url, 0) + 1
        updates, weights = run_round(p, "main", clients, rnd, seed=1000 * rnd)
        with p.root_client("main", "c0") as fl:
            model = fl.wait_for_version(rnd, timeout=120)
        assert model.version == rnd
        assert_fedavg(model.data, updates, weights)
    assert set(placed) == set(p.gateways.values()), "clients on both node gateways"
    endpoints = p.endpoints()
    assert all(endpoints.values()), f"both nodes have function endpoints: {endpoints}"
    p.endpoint_pids_are_replicas()
    after = p.tasks_done()
    ran = sum(after.get(pid, 0) - before.get(pid, 0) for pid in after)
    # 3 rounds x (3 leaves per node x 2 nodes + at least the top): every slot ran in a replica
    assert ran >= 3 * 7, (before, after)


def test_warm_replicas_serve_the_next_jobs_back_to_back_and_interleaved(
    platform: Platform,
) -> None:
    p = platform
    wait_until(lambda: all(len(e) >= 2 for e in p.endpoints().values()), 60, "warm endpoints")
    # a scale-up the last round asked for has finished: every replica is ready and registered
    wait_until(lambda: len(p.replicas()) == len(p.replicas(ready=False)), 60, "no replica starting")
    pids = {r["pid"] for r in p.replicas(ready=False)}

    def served() -> set[int]:
        """Jobs the replicas that were warm before these jobs served."""
        ids = set()
        for rep in p.replicas():
            if rep["pid"] not in pids:
                continue
            st = p.replica_status(rep)
            ids |= {j for e in st["endpoints"] for j in e["jobs_served"]}
        return ids

    clients = ["a", "b", "c", "d"]
    for job in ("ra", "rb"):  # back to back
        p.create_job(job, clients, rounds=1)
        updates, weights = run_round(p, job, clients, 1, seed=hash(job) % 1000)
        with p.root_client(job, "a") as fl:
            assert_fedavg(fl.wait_for_version(1, timeout=120).data, updates, weights)
    assert {r["pid"] for r in p.replicas(ready=False)} == pids, "no replica started for them"
    p.create_job("ia", clients, rounds=1)
    p.create_job("ib", clients, rounds=1)
    p.wait_open("ia", 1)
    p.wait_open("ib", 1)
    sent: dict[str, tuple[list[dict[str, np.ndarray]], list[int]]] = {
        "ia": ([], []),
        "ib": ([], []),
    }
    for i, c in enumerate(clients):  # interleaved: ia and ib uploads alternate
        for job in ("ia", "ib"):
            u, w = make_update(500 + i + (job == "ib") * 50), i + 1
            with p.client(job, c) as fl:
                fl.upload(1, save(u), w)
            sent[job][0].append(u)
            sent[job][1].append(w)
    for job in ("ia", "ib"):
        with p.root_client(job, "a") as fl:
            assert_fedavg(fl.wait_for_version(1, timeout=120).data, *sent[job])
    # two jobs at once may outrun the warm endpoints for a moment (a leaf of each and their
    # tops on one node): the control plane may then add a replica (its queue forecast), yet
    # the replicas that were warm serve both
    ids = {p.progress(j, "node0")["id"] for j in ("ra", "rb", "ia", "ib")}
    assert ids <= served(), "the same warm replicas were granted every job"


def test_a_replica_killed_mid_round_loses_nothing_and_counts_nothing_twice(
    platform: Platform,
) -> None:
    p = platform
    clients = ["k0", "k1", "k2", "k3"]
    p.create_job("kill", clients, rounds=1, per_leaf=2)
    p.wait_open("kill", 1)
    # one update per leaf first: each leaf slot holds an endpoint and waits for its second
    assigned = {c: p.client("kill", c) for c in clients}
    by_node: dict[str, list[str]] = {}
    for c, fl in assigned.items():
        by_node.setdefault(fl.gateway_url, []).append(c)
    first = [cs[0] for cs in by_node.values()]
    rest = [c for c in clients if c not in first]
    updates: dict[str, tuple[dict[str, np.ndarray], int]] = {}
    for i, c in enumerate(first + rest):
        updates[c] = (make_update(900 + i), i + 2)
    for c in first:
        assigned[c].upload(1, save(updates[c][0]), updates[c][1])

    def running_leaf() -> tuple[str, str, int] | None:
        for node in p.gateways:
            # null until the node's engine exists: a node no client of the job was placed on
            slots = (p.progress("kill", node).get("progress") or {}).get("slots", {})
            for sid, s in slots.items():
                if s["node"] == node and s["endpoint"] is not None and not s["done"]:
                    return node, sid, s["endpoint"]
        return None

    node, sid, endpoint = wait_until(running_leaf, 60, "a leaf running in a replica")
    [victim] = [e["pid"] for e in p.endpoints()[node] if e["id"] == endpoint]
    assert victim in {r["pid"] for r in p.replicas(ready=False)}
    os.kill(victim, signal.SIGKILL)

    def attempts() -> int:
        slot = p.progress("kill", node)["progress"]["slots"][sid]
        return int(slot["attempts"]) if slot["endpoint"] is not None else 0

    # the slot runs again, in another endpoint, from the update the node holds
    wait_until(lambda: attempts() >= 2, 60, "the killed replica's slot to run again")
    for c in rest:
        assigned[c].upload(1, save(updates[c][0]), updates[c][1])
    with p.root_client("kill", "k0") as fl:
        model = fl.wait_for_version(1, timeout=120)
    order = first + rest
    assert_fedavg(model.data, [updates[c][0] for c in order], [updates[c][1] for c in order])
    for fl in assigned.values():
        fl.close()


def test_the_function_scales_back_down_when_idle(platform: Platform) -> None:
    p = platform
    # FEDFAAS_CONTROL_SCALE_DOWN_S reached the control plane (its command line, in its log)
    log = (p.state_dir / "logs" / "control-plane.log").read_text()
    assert "--scale-down 20.0" in log
    wait_until(lambda: len(p.replicas()) == 1, 90, "scale-down to the minimum after idling")


def test_the_root_gateway_and_the_control_plane_killed_mid_round_restart_and_lose_nothing(
    platform: Platform,
) -> None:
    """SIGKILL of the job's root gateway and of the control plane after half the round's
    uploads: the platform's supervisor starts both again on their ports (``status`` counts the
    restarts), the gateway resumes the round from its journal and shared memory, the control
    plane its jobs from Redis, within the node grace (no evacuation), and the round's model is
    the FedAvg of every acknowledged update, each once."""
    p = platform
    clients = [f"r{i}" for i in range(6)]
    p.create_job("restart", clients, rounds=1)
    p.wait_open("restart", 1)
    sent = {c: (make_update(700 + i), i + 1) for i, c in enumerate(clients)}
    for c in clients[:3]:
        with p.client("restart", c) as fl:
            fl.upload(1, save(sent[c][0]), sent[c][1])
    cp = p.urls["control_plane"]
    root = httpx.get(f"{cp}/v1/jobs/restart", headers=p.admin, timeout=10).json()["root"]
    victims = {"gateway" if root == "node0" else "gateway-node1", "control-plane"}
    st = state.load(p.state_dir)
    assert st is not None
    before = {r.name: r for r in st.services if r.name in victims}
    for rec in before.values():
        os.kill(rec.pid, signal.SIGKILL)

    def restarted() -> bool:
        now = state.load(p.state_dir)
        assert now is not None
        recs = {r.name: r for r in now.services if r.name in victims}
        return all(
            r.pid != before[n].pid and r.extra.get("restarts") == "1" for n, r in recs.items()
        ) and _answers(f"{cp}/healthz")

    wait_until(restarted, 60, "the supervisor to restart the root gateway and the control plane")
    for c in clients[3:]:
        with p.client("restart", c) as fl:
            fl.upload(1, save(sent[c][0]), sent[c][1])
    with p.root_client("restart", "r0") as fl:
        model = fl.wait_for_version(1, timeout=120)
    assert_fedavg(model.data, [u for u, _ in sent.values()], [w for _, w in sent.values()])
    job = wait_until(
        lambda: (
            (j := httpx.get(f"{cp}/v1/jobs/restart", headers=p.admin, timeout=10).json())["done"]
            and j
        ),
        60,
        "the control plane to close the round",
    )
    assert job["history"][0]["lost"] == 0, job
    out = run_module("fedfaas.cli", "status", "--state-dir", str(p.state_dir))
    assert "restarts 1" in out.stdout and "supervisor" in out.stdout, out.stdout


def test_a_flower_quickstart_client_trains_through_fedfaas_unchanged(platform: Platform) -> None:
    """Issue 14, item 6: a client written for Flower (``flwr.client.NumPyClient``, as in
    Flower's PyTorch quickstart) takes part in a FedFaaS job through ``client.flower``, the
    launch line being the only change. Three clients, three rounds on the digits data: every
    published model is the FedAvg (by example counts, as Flower's FedAvg) of the arrays their
    ``fit`` returned, and the loss ``evaluate`` reports on the global model falls."""
    from collections import OrderedDict
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from flwr.client import NumPyClient

    from client.data import federated_digits
    from client.flower import flower_arrays, flower_weights, run_numpy_client
    from client.model import DigitsCNN
    from client.sdk import submit_job

    torch.set_num_threads(1)

    class QuickstartClient(NumPyClient):  # type: ignore[misc]
        """Flower's quickstart client, on the digits shards (no FedFaaS import in it)."""

        def __init__(self, x: np.ndarray, y: np.ndarray, seed: int) -> None:
            torch.manual_seed(seed)
            self.net = DigitsCNN()
            self.x, self.y = torch.tensor(x), torch.tensor(y)

        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return [val.cpu().numpy() for _, val in self.net.state_dict().items()]

        def set_parameters(self, parameters: list[np.ndarray]) -> None:
            params_dict = zip(self.net.state_dict().keys(), parameters, strict=True)
            state_dict = OrderedDict({k: torch.tensor(v) for k, v in params_dict})
            self.net.load_state_dict(state_dict, strict=True)

        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            self.set_parameters(parameters)
            opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
            for _ in range(5):
                for i in range(0, len(self.y), 32):
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(
                        self.net(self.x[i : i + 32]), self.y[i : i + 32]
                    )
                    loss.backward()
                    opt.step()
            return self.get_parameters(config={}), len(self.y), {}

        def evaluate(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[float, int, dict[str, Any]]:
            self.set_parameters(parameters)
            with torch.no_grad():
                out = self.net(self.x)
                loss = float(torch.nn.functional.cross_entropy(out, self.y))
                acc = float((out.argmax(1) == self.y).float().mean())
            return loss, len(self.y), {"accuracy": acc}

    p = platform
    data = federated_digits(3, alpha=10.0, seed=3, prefix="fl")
    clients = {c.client_id: QuickstartClient(c.x, c.y, seed=i) for i, c in enumerate(data.clients)}
    first = next(iter(clients.values()))
    created = submit_job(
        p.urls["control_plane"],
        "flower",
        flower_weights(first.get_parameters({})),
        rounds=3,
        clients=list(clients),
        admin_token=p.admin_secret,
    )
    tokens = created["tokens"]
    with ThreadPoolExecutor(len(clients)) as pool:
        runs = {
            c: pool.submit(
                run_numpy_client, fl, p.urls["control_plane"], "flower", c, tokens[c], timeout=180
            )
            for c, fl in clients.items()
        }
        rounds = {c: f.result(timeout=300) for c, f in runs.items()}
    assert all([r.round for r in rs] == [1, 2, 3] for rs in rounds.values()), rounds
    with FLClient(p.gateways["node0"], "flower", "fl-000", tokens["fl-000"]) as fl:
        final = fl.wait_for_version(3, timeout=60)
    got = flower_arrays(final.data)
    last = [rs[-1] for rs in rounds.values()]
    fits = [flower_arrays(r.weights) for r in last]
    for i, arr in enumerate(got):
        want = fedavg.fedavg_reference([f[i] for f in fits], [r.fit_examples for r in last])
        assert fedavg.rel_error(arr, want) <= 1e-6, i
    mean_loss = [np.mean([rs[k].loss for rs in rounds.values()]) for k in range(3)]
    assert mean_loss[2] < mean_loss[0], mean_loss
    view = httpx.get(f"{p.urls['control_plane']}/v1/jobs/flower", headers=p.admin).json()
    assert view["done"] and [h["aggregated"] for h in view["history"]] == [3, 3, 3], view


def test_an_oort_job_trains_the_clients_flstore_ranks(platform: Platform) -> None:
    """Issue 14, item 2: a job created with ``selection="oort"`` through the SDK gets its
    rounds' clients from FLStore's scheduling workload, which the control plane asks through
    the request tracker (``fedfaas up`` wires them), fed by the earlier rounds' client
    metadata in the cache. Of 8 enrolled clients, 4 train per round: round 1 is random; round
    2 takes the 4 Oort has not seen (it explores first); in round 3, when all have been seen,
    it exploits: the 4 with a high loss that trained fast, exactly what the tracker answers
    the same query. A job whose clients report no ``duration_s`` gets random rounds that say
    why, and completes."""
    from client.sdk import QueryFailed, flstore_query, submit_job
    from control_plane.jobs import seed_of

    p = platform
    analyst = credentials.read(p.state_dir / "secrets", credentials.ANALYST_TOKEN)
    w0 = save({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})
    clients = [f"o{i}" for i in range(8)]
    useful = {"o1", "o2", "o5", "o6"}  # high loss, fast; the others: low loss, slow

    def run(job: str, rounds: int, meta: Callable[[str], dict[str, float]]) -> list[dict]:
        created = submit_job(
            p.urls["control_plane"],
            job,
            w0,
            rounds=rounds,
            goal=4,
            clients=clients,
            overprovision=1.0,
            selection="oort",
            admin_token=p.admin_secret,
        )
        p.tokens[job] = created["tokens"]
        seen = []
        for rnd in range(1, rounds + 1):
            p.wait_open(job, rnd)
            view = httpx.get(
                f"{p.urls['control_plane']}/v1/jobs/{job}", headers=p.admin, timeout=10
            ).json()["round"]
            chosen = {}  # every assignment first: the last upload lets the next round open
            for c in clients:
                a = httpx.get(
                    f"{p.urls['control_plane']}/v1/jobs/{job}/assignment",
                    params={"client": c},
                    headers={"Authorization": f"Bearer {p.tokens[job][c]}"},
                    timeout=10,
                )
                assert a.status_code in (200, 409), a.text
                if a.status_code == 409:
                    assert a.json()["error"] == "client_not_selected"
                    continue
                assert a.json()["round"] == rnd
                chosen[c] = a.json()["gateway_url"]
            for c, url in chosen.items():
                with FLClient(url, job, c, p.tokens[job][c]) as fl:
                    fl.wait_for_version(rnd - 1, timeout=120)
                    fl.upload(rnd, save(make_update(rnd * 10 + int(c[1:]))), 10, meta=meta(c))
            seen.append({**view, "clients": set(chosen)})
        with p.root_client(job, clients[0]) as fl:
            fl.wait_for_version(rounds, timeout=120)
        return seen

    def fast_and_useful(c: str) -> dict[str, float]:
        good = c in useful
        return {"loss": 2.0 + int(c[1:]) / 10 if good else 0.1, "duration_s": 0.1 if good else 5.0}

    r1, r2, r3 = run("oort-job", 3, fast_and_useful)
    assert r1["selected_by"] == "random" and len(r1["clients"]) == 4
    assert (r2["selected_by"], r2["selection_note"]) == ("oort", "")
    assert r2["clients"] == set(clients) - r1["clients"]  # Oort explores the unseen first
    assert (r3["selected_by"], r3["selection_note"], r3["clients"]) == ("oort", "", useful)

    def recorded() -> list[dict[str, Any]] | None:  # the control plane closes at a poll
        view = httpx.get(
            f"{p.urls['control_plane']}/v1/jobs/oort-job", headers=p.admin, timeout=10
        ).json()
        return view["history"] if view["completed"] == 3 else None

    history = wait_until(recorded, 60, "the control plane to record round 3 of oort-job")
    assert [(h["selected_by"], h["aggregated"]) for h in history] == [
        ("random", 4),
        ("oort", 4),
        ("oort", 4),
    ]
    answer = flstore_query(
        p.urls["request_tracker"],
        "oort",
        "oort-job",
        params={"round": 3, "k": 4, "candidates": clients, "seed": seed_of("oort-job", 3)},
        token=analyst,
    )
    assert set(answer["result"]["selected"]) == r3["clients"]

    _, fallback = run("oort-blind", 2, lambda c: {"loss": 1.0})
    assert fallback["selected_by"] == "random"
    assert "409 missing_data" in fallback["selection_note"], fallback["selection_note"]
    assert "duration_s" in fallback["selection_note"]
    # an analyst asking the same gets the workload's own answer at once (the tracker used to
    # take it for an evicted cache function, retry, and answer 503 "no holder answered")
    with pytest.raises(QueryFailed) as refused:
        flstore_query(
            p.urls["request_tracker"],
            "oort",
            "oort-blind",
            params={"round": 2, "k": 4},
            token=analyst,
        )
    assert (refused.value.status, refused.value.error) == (409, "missing_data")
    assert "duration_s" in refused.value.detail


def test_a_multi_krum_job_from_the_sdk_runs_sharded_in_the_function_and_drops_the_poisoned(
    platform: Platform,
) -> None:
    """Issue 15: ``submit_job(aggregation=...)`` on the user's platform. The control plane
    keeps the job on its root node, the root gateway runs Multi-Krum as coordinate shards on
    the function's endpoints, and the model equals the numpy reference: the two poisoned
    updates are left out and the result is near the honest mean."""
    from client.sdk import submit_job
    from core import robust

    p = platform
    clients = [f"k{i}" for i in range(10)]
    poisoned = {"k2", "k7"}
    w0 = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    spec = {"rule": "multi-krum", "f": 2, "shards": 2}
    before = p.tasks_done()
    made = submit_job(
        p.urls["control_plane"],
        "krum",
        save(w0),
        rounds=2,
        admin_token=p.admin_secret,
        clients=clients,
        aggregation=spec,
    )
    p.tokens["krum"] = made["tokens"]
    view = httpx.get(f"{p.urls['control_plane']}/v1/jobs/krum", headers=p.admin, timeout=10).json()
    assert view["aggregation"] == "multi-krum"
    root_url = p.gateways[view["root"]]
    g = {k: v.astype(np.float64) for k, v in w0.items()}
    rng = np.random.default_rng(15)
    for rnd in (1, 2):
        p.wait_open("krum", rnd)
        ups, weights = [], []
        for c in clients:
            delta = {k: 0.1 + 0.05 * rng.standard_normal(s) for k, s in SHAPES.items()}
            sign = -100.0 if c in poisoned else 1.0
            u = {k: (g[k] + sign * delta[k]).astype(np.float32) for k in SHAPES}
            with p.client("krum", c) as fl:
                assert fl.gateway_url == root_url, "a robust job's clients all go to its root"
                fl.wait_for_version(rnd - 1, timeout=120)
                fl.upload(rnd, save(u), 5)
            ups.append(u)
            weights.append(5)
        with FLClient(root_url, "krum", "k0", p.tokens["krum"]["k0"]) as fl:
            got = load(fl.wait_for_version(rnd, timeout=120).data)
        flat = [np.concatenate([u[k].ravel() for k in sorted(SHAPES)]) for u in ups]
        base = np.concatenate([g[k].ravel() for k in sorted(SHAPES)]).astype(np.float32)
        want = robust.reference(robust.RobustRule.from_json(spec), flat, base, weights)
        have = np.concatenate([got[k].ravel() for k in sorted(SHAPES)])
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
        honest = np.mean([f for c, f in zip(clients, flat, strict=True) if c not in poisoned], 0)
        assert robust.far(have - base, honest - base) < 0.2
        g = {k: got[k].astype(np.float64) for k in SHAPES}
    after = p.tasks_done()
    # 2 rounds x (2 Gram shards + 2 reducing shards), all run by replicas of the function
    assert sum(after.get(pid, 0) - before.get(pid, 0) for pid in after) >= 8, (before, after)


def _meta_json(p: Platform, job: str, rnd: int) -> dict[str, Any]:
    """Round ``rnd``'s ``meta.json`` of ``job`` in the platform's MinIO (checkpoints are
    written just after publication: waited for)."""
    from minio import Minio
    from minio.error import S3Error

    secrets = p.state_dir / "secrets"
    mc = Minio(
        p.urls["minio"].removeprefix("http://"),
        access_key=credentials.read(secrets, credentials.MINIO_USER),
        secret_key=credentials.read(secrets, credentials.MINIO_PASSWORD),
        secure=False,
    )

    def read() -> dict[str, Any] | None:
        try:
            return dict(
                json.loads(mc.get_object("fedfaas", f"{job}/rounds/{rnd:06d}/meta.json").read())
            )
        except S3Error:
            return None

    return wait_until(read, 60, f"round {rnd}'s meta.json of {job} in MinIO")  # type: ignore[no-any-return]


def test_a_job_drops_the_clients_flstore_flagged_before_aggregating_the_next_round(
    platform: Platform,
) -> None:
    """Issue 15, item 4, the debugging loop closed on the user's platform: a FedAvg job of 6
    clients, 5 a round, created with ``drop_flagged`` (FLStore's Multi-Krum) has the control
    plane ask the request tracker after round 1 which client the cache function flags: the
    one that sent a sign-flipped update. Round 2 leaves it out (not selected; an upload from
    it is refused 403 ``client_excluded``), aggregates the other five only (exactly their
    FedAvg), and its ``meta.json`` records the decision."""
    from client.sdk import UpdateRejected, submit_job

    p = platform
    cp = p.urls["control_plane"]
    clients = [f"f{i}" for i in range(6)]
    w0 = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    made = submit_job(
        cp,
        "flagged",
        save(w0),
        rounds=2,
        goal=5,
        clients=clients,
        overprovision=1.0,
        drop_flagged={"workload": "multi-krum", "params": {"f": 1}},
        admin_token=p.admin_secret,
    )
    p.tokens["flagged"] = made["tokens"]

    def assignment(c: str) -> httpx.Response:
        return httpx.get(
            f"{cp}/v1/jobs/flagged/assignment",
            params={"client": c},
            headers={"Authorization": f"Bearer {p.tokens['flagged'][c]}"},
            timeout=10,
        )

    rng = np.random.default_rng(16)
    g = {k: v.astype(np.float64) for k, v in w0.items()}
    bad = ""
    for rnd in (1, 2):
        p.wait_open("flagged", rnd)
        view = httpx.get(f"{cp}/v1/jobs/flagged", headers=p.admin, timeout=10).json()
        chosen = {}  # every assignment first: the last upload lets the next round open
        for c in clients:
            a = assignment(c)
            if a.status_code == 409:
                assert a.json()["error"] == "client_not_selected", a.text
                continue
            assert a.status_code == 200, a.text
            chosen[c] = a.json()["gateway_url"]
        assert len(chosen) == 5
        bad = bad or sorted(chosen)[0]  # round 1's first selected client is the attacker
        if rnd == 2:  # dropped before aggregation: not selected, its upload refused
            assert bad not in chosen
            with p.root_client("flagged", bad) as fl, pytest.raises(UpdateRejected) as no:
                fl.wait_for_version(1, timeout=120)
                fl.upload(rnd, save(w0), 5)
            assert (no.value.status, no.value.error) == (403, "client_excluded")
            assert "multi-krum flagged it in round 1" in no.value.detail
        ups, weights = [], []
        for c in sorted(chosen):
            delta = {k: 0.1 + 0.02 * rng.standard_normal(s) for k, s in SHAPES.items()}
            sign = -100.0 if c == bad else 1.0
            u = {k: (g[k] + sign * delta[k]).astype(np.float32) for k in SHAPES}
            with FLClient(chosen[c], "flagged", c, p.tokens["flagged"][c]) as fl:
                fl.wait_for_version(rnd - 1, timeout=120)
                fl.upload(rnd, save(u), 5)
            ups.append(u)
            weights.append(5)
        with p.root_client("flagged", sorted(chosen)[-1]) as fl:
            got = load(fl.wait_for_version(rnd, timeout=120).data)
        for k in SHAPES:
            want = fedavg.fedavg_reference([u[k] for u in ups], weights)
            assert fedavg.rel_error(got[k], want) <= 1e-6, k
        if rnd == 2:
            why = {bad: {"flagged_in": 1, "workload": "multi-krum"}}
            assert view["round"]["excluded"] == why and view["flagged"] == why
            assert view["round"]["drop_note"] == ""
        g = {k: got[k].astype(np.float64) for k in SHAPES}
    meta = _meta_json(p, "flagged", 2)
    assert meta["excluded"] == {bad: {"flagged_in": 1, "workload": "multi-krum"}}
    assert set(meta["clients"]) == set(clients) - {bad} and meta["count"] == 5
    assert "excluded" not in _meta_json(p, "flagged", 1)


def test_a_dp_job_from_the_sdk_is_noised_accounted_and_stopped_at_its_budget(
    platform: Platform,
) -> None:
    """Issue 15, item 3 on the user's platform: ``submit_job(aggregation={"rule":
    "dp-fedavg", ...})``. The root gateway clips each delta and adds the noise in the
    function's shards (the published model minus the clipped mean has the configured std);
    the control plane's view and ``/metrics`` carry the epsilon spent, equal to
    dp-accounting's own figure, and the job ends before the round that would pass its
    budget."""
    from client.sdk import submit_job
    from core import privacy, robust

    p = platform
    clients = [f"d{i}" for i in range(6)]
    z, clip, goal, q = 2.0, 0.5, 3, 0.5  # 3 of 6 clients a round
    budget = (privacy.epsilon(z, [q] * 2, 1e-5) + privacy.epsilon(z, [q] * 3, 1e-5)) / 2
    spec = {"rule": "dp-fedavg", "clip": clip, "noise_multiplier": z, "epsilon": budget}
    w0 = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    made = submit_job(
        p.urls["control_plane"],
        "private",
        save(w0),
        rounds=4,
        goal=goal,
        clients=clients,
        overprovision=1.0,
        aggregation=spec,
        admin_token=p.admin_secret,
    )
    p.tokens["private"] = made["tokens"]
    g = np.concatenate([w0[k].ravel() for k in sorted(SHAPES)]).astype(np.float32)
    noise = []
    for rnd in (1, 2):
        p.wait_open("private", rnd)
        chosen = {}  # every assignment first: the last upload lets the next round open
        for c in clients:
            a = httpx.get(
                f"{p.urls['control_plane']}/v1/jobs/private/assignment",
                params={"client": c},
                headers={"Authorization": f"Bearer {p.tokens['private'][c]}"},
                timeout=10,
            )
            if a.status_code == 200:
                assert a.json()["round"] == rnd, a.text
                chosen[c] = a.json()["gateway_url"]
        assert len(chosen) == goal
        flat = []
        for c, url in chosen.items():
            u = make_update(rnd * 100 + int(c[1:]))  # norm ~ 45: every delta is clipped
            with FLClient(url, "private", c, p.tokens["private"][c]) as fl:
                fl.wait_for_version(rnd - 1, timeout=120)
                fl.upload(rnd, save(u), 10)
            flat.append(np.concatenate([u[k].ravel() for k in sorted(SHAPES)]))
        # the job lives on its root node alone, where its clients upload (node0 or node1)
        c, root = next(iter(chosen.items()))
        with FLClient(root, "private", c, p.tokens["private"][c]) as fl:
            got = load(fl.wait_for_version(rnd, timeout=120).data)
        have = np.concatenate([got[k].ravel() for k in sorted(SHAPES)])
        rule = robust.RobustRule.from_json(spec)
        noise.append(have - robust.reference(rule, flat, g, [10] * goal, expected=goal))
        g = have
    drawn = np.concatenate(noise)
    assert abs(drawn.std() / (z * clip / goal) - 1) < 0.1  # 4160 draws: 1.1% standard error
    cp = p.urls["control_plane"]

    def stopped() -> dict[str, Any] | None:
        view = httpx.get(f"{cp}/v1/jobs/private", headers=p.admin, timeout=10).json()
        return view if view["done"] else None

    view = wait_until(stopped, 60, "the DP job to stop at its budget")
    assert view["completed"] == 2 and view["stopped"].startswith("privacy budget: round 3")
    assert view["privacy"]["epsilon"] == pytest.approx(privacy.epsilon(z, [q, q], 1e-5))
    assert view["privacy"]["sampling_rates"] == [q]
    analyst = credentials.read(p.state_dir / "secrets", credentials.ANALYST_TOKEN)
    text = httpx.get(f"{cp}/metrics", headers={"Authorization": f"Bearer {analyst}"}).text
    assert (
        f'fedfaas_control_job_privacy_epsilon{{job="private"}} {view["privacy"]["epsilon"]!r}'
        in text
    )
    meta = _meta_json(p, "private", 2)["aggregation"]
    assert meta["rule"]["rule"] == "dp-fedavg" and meta["clipped"] == goal
    # a job with a budget draws its noise from the OS's entropy and records no seed
    assert meta["noise_std"] == pytest.approx(z * clip / goal) and "noise_seed" not in meta


def test_contributions_of_a_cnn_job_are_scored_by_its_evaluator_function(
    platform: Platform,
) -> None:
    """Issue 16, item 1: a job whose model is the demo's CNN (not digits-softmax) names the
    evaluator function ``fedfaas up`` deployed from stack.yml (``digits-evaluator``). Its
    clients train a round for real; leave-one-out, GTG-Shapley and incentives asked through
    the request tracker are computed in the cache function, which sends each sub-model as
    safetensors to the function, several at once, and equal the same workloads computed here
    on the same objects (read from MinIO) with the CNN scored in process."""
    from client.data import load_digits_arrays, stratified_test_split
    from client.model import make_model

    x, y = load_digits_arrays()
    _, held_out = stratified_test_split(y, 0.2, np.random.default_rng(0))
    _scored_job(
        platform,
        "cnn-scored",
        lambda: make_model(0, "cnn"),
        "digits-evaluator",
        x[held_out],
        y[held_out],
    )


def test_a_users_own_model_is_scored_by_the_evaluator_function_they_deploy(
    platform: Platform, tmp_path: Path
) -> None:
    """Issue 16, item 1, a user's own model: an MLP of another shape, scored by an evaluator
    function written from the documented example (``tests/platform/mlp_evaluator``) and
    deployed on the running platform with ``fedfaas deploy -f`` (as ``faas-cli deploy``; the
    embedded runtime finds the handler folder through the ``com.fedfaas.handler`` annotation);
    leave-one-out, GTG-Shapley and incentives through the tracker equal the in-process
    computation."""
    import shutil

    from cache_engine.evaluators import digits_split
    from tests.platform.mlp_evaluator.handler import mlp

    shutil.copytree(REPO / "template", tmp_path / "template")
    stack = tmp_path / "stack.yml"
    stack.write_text(
        "version: 1.0\n"
        "provider:\n  name: openfaas\n"
        "functions:\n"
        "  mlp-evaluator:\n"
        "    lang: python3-http\n"
        f"    handler: {REPO / 'tests' / 'platform' / 'mlp_evaluator'}\n"
        "    image: example.org/mlp-evaluator:1\n"
        "    environment: {read_timeout: 2m, write_timeout: 2m, exec_timeout: 2m}\n"
        "    secrets: [fedfaas-function-token]\n"
        # the embedded runtime runs handler folders: where this image's handler is
        f"    annotations: {{com.fedfaas.handler: {REPO / 'tests' / 'platform' / 'mlp_evaluator'}}}\n"
    )
    fedfaas("deploy", "-f", str(stack), "--state-dir", str(platform.state_dir), env=any_ports_env())
    wait_until(lambda: platform.replicas(function="mlp-evaluator"), 120, "mlp-evaluator ready")
    _, _, xv, yv = digits_split(seed=4)

    def model() -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return mlp()

    _scored_job(platform, "mlp-scored", model, "mlp-evaluator", xv, yv)


def _scored_job(
    p: Platform,
    job: str,
    model: Callable[[], Any],
    function: str,
    x_val: np.ndarray,
    y_val: np.ndarray,
) -> None:
    """A one-round job of ``model()`` trained for real by 5 clients, scored by the evaluator
    ``function``; FLStore's leave-one-out, GTG-Shapley and incentives through the tracker
    must equal the same workloads run here with the model scored in process on
    ``(x_val, y_val)``."""
    from cache_engine.catalog import MemoryCatalog
    from cache_engine.cold_store import MinioColdStore
    from cache_engine.queries import parse_query, plan, run_workload
    from client.data import federated_digits
    from client.model import load_bytes_into, model_to_bytes
    from client.sdk import submit_job
    from client.train import TrainConfig, train_local
    from flstore_workloads import TorchEvaluator

    data = federated_digits(5, seed=3)
    clients = [c.client_id for c in data.clients]
    created = submit_job(
        p.urls["control_plane"],
        job,
        model_to_bytes(model()),
        rounds=1,
        clients=clients,
        overprovision=1.0,
        evaluator={"kind": "function", "function": function, "parallel": 3},
        admin_token=p.admin_secret,
    )
    p.tokens[job] = created["tokens"]
    p.wait_open(job, 1)
    for c in data.clients:
        with p.client(job, c.client_id) as fl:
            m = load_bytes_into(model(), fl.wait_for_version(0).data)
            res = train_local(m, c.x, c.y, TrainConfig(epochs=1))
            fl.upload(1, m.state_dict(), res.num_samples, meta={"loss": res.mean_loss})
    with p.root_client(job, clients[0]) as fl:
        fl.wait_for_version(1, timeout=120)

    analyst = credentials.read(p.state_dir / "secrets", credentials.ANALYST_TOKEN)
    secrets = p.state_dir / "secrets"
    cold = MinioColdStore(
        p.urls["minio"].removeprefix("http://"),
        credentials.read(secrets, credentials.MINIO_USER),
        credentials.read(secrets, credentials.MINIO_PASSWORD),
        "fedfaas",
        create=False,
    )
    module = model()
    here = TorchEvaluator(module, x_val, y_val, names=sorted(module.state_dict()))
    queries = [
        ("leave-one-out", {}),
        ("shapley", {"method": "gtg", "seed": 2, "round_trunc_threshold": 0.0}),
        ("incentives", {"budget": 100.0, "contribution": "gtg"}),
    ]
    for workload, params in queries:
        answer = wait_until(
            lambda w=workload, q=params: _answer_when_ingested(
                p, w, job, {"round": 1, **q}, analyst
            ),
            120,
            f"FLStore's {workload} answer",
        )
        got = answer["result"]
        q = parse_query({"workload": workload, "job": job, "params": {"round": 1, **params}})
        cat = MemoryCatalog()
        cat.add_round(job, 0, [])
        cat.add_round(job, 1, clients)
        pl = plan(q, cat)
        want = run_workload(workload, pl.params, {k: cold.get(k) for k in pl.keys}, here)
        key = "payouts" if workload == "incentives" else "values"
        assert set(got[key]) == set(clients), got
        for c in clients:
            assert got[key][c] == pytest.approx(want[key][c], abs=1e-9), (workload, c)
        if workload == "leave-one-out":
            assert got["v_full"] == pytest.approx(want["v_full"], abs=1e-12)
            assert any(got["values"].values())  # the sub-models scored differently


def _answer_when_ingested(
    p: Platform, workload: str, job: str, params: dict[str, Any], token: str
) -> dict[str, Any] | None:
    """The tracker's answer, or None while the round has not reached FLStore yet."""
    from client.sdk import QueryFailed, flstore_query

    try:
        return flstore_query(p.urls["request_tracker"], workload, job, params=params, token=token)
    except QueryFailed as exc:
        if exc.error in ("round_not_written", "unknown_job"):
            return None
        raise
