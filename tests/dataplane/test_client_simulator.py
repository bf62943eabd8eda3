"""Client simulator and the demo driver against real node gateways."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from client.data import federated_digits
from client.model import make_model, model_to_bytes
from client.sdk import create_job
from client.simulator import Simulator, SimulatorConfig, assignment_from_plan, round_robin
from fedfaas.checkpoints import CheckpointReader
from fedfaas.demo import DemoConfig, DemoResult, fedavg_error, run
from fedfaas.demo.main import ensure_checkpoints
from fedfaas.services import MinioServer
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
def test_demo_writes_the_checkpoints_the_gateways_did_not(
    minio_server: MinioServer, tmp_path: Path
) -> None:
    cfg = DemoConfig(job=f"fallback-{os.urandom(3).hex()}")
    result = DemoResult(
        rounds=[{"round": 1, "version": 1, "accuracy": 0.5, "loss": 1.0, "seconds": 2.0}]
    )
    run_data = {
        "globals": {1: b"global-1"},
        "updates": {(1, "client-000"): b"u0", (1, "client-001"): b"u1"},
        "client_nodes": {"client-000": "a", "client-001": "b"},
        "samples": {"client-000": 3, "client-001": 5},
    }
    ensure_checkpoints(cfg, minio_server, run_data, result, tmp_path, wait=0.2)
    assert "demo driver" in result.checkpoints_by
    assert result.checkpoint_keys == [f"{cfg.job}/rounds/000001/global.safetensors"]
    r = CheckpointReader(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    assert r.get_global(cfg.job, 1) == b"global-1"
    assert r.clients(cfg.job, 1) == ["client-000", "client-001"]
    assert r.get_client(cfg.job, 1, "client-001") == b"u1"
    meta = r.get_meta(cfg.job, 1)
    assert meta["accuracy"] == 0.5 and meta["clients"][1] == {
        "client": "client-001",
        "node": "b",
        "num_samples": 5,
    }


@pytest.mark.integration
def test_demo_runs_a_two_node_job_reports_and_stops_everything(tmp_path: Path) -> None:
    before = {d for d in os.listdir("/dev/shm") if d.startswith("fedfaas-demo-")}
    cfg = DemoConfig(clients=6, rounds=2, nodes=2, min_accuracy=0.2)
    assert run(tmp_path, cfg) == 0
    out = tmp_path / "demo"
    report = json.loads((out / "demo.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert all(r["fedavg_max_rel_err"] < 1e-5 for r in report["rounds"])
    # round 0 is the initial model, checkpointed when the job is created
    assert [k.split("/rounds/")[1] for k in report["checkpoint_keys"]] == [
        f"{r:06d}/global.safetensors" for r in (0, 1, 2)
    ]
    assert report["checkpoints_by"]
    assert (out / "demo.png").stat().st_size > 10_000
    after = {d for d in os.listdir("/dev/shm") if d.startswith("fedfaas-demo-")}
    assert after - before == set()
    leftovers = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(tmp_path) in cmd:
            leftovers.append(cmd)
    assert leftovers == []
