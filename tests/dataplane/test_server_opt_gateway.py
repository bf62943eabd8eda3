"""Server optimizers on real gateways (issue 14, item 5): the root steps each round's FedAvg
with the job's optimizer, and every published model equals Flower's strategy of the same
name on the same uploads; the state is journaled with the model (a SIGKILLed root resumes
it), checkpointed beside it in MinIO (a resumed job and a node taking the job over continue
it), and a bad spec is refused before anything is created."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from client.sdk import SERVER_OPT_KEY
from core import fedavg, wire
from core.server_opt import METADATA_KEY, state_from_safetensors
from core.services import free_port
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import delete_and_resume, tiny_model
from tests.dataplane.rounds import assert_job_refused, job_request, upload, wait_version
from tests.dataplane.test_gateway_recovery import _aggregators, _gateway, _kill
from tests.polling import wait_until

pytestmark = pytest.mark.integration
flwr = pytest.importorskip("flwr")

FLOAT = ("layer.bias", "layer.weight")  # "steps" is int64 on the wire: rounded when published
CLIENTS = ["c0", "c1", "c2"]


def _create(url: str, secret: str, spec: dict[str, object], rounds: int, **params: str) -> dict:
    meta = {SERVER_OPT_KEY: json.dumps(spec)}
    r = job_request(url, secret, CLIENTS, 3, rounds, metadata=meta, **params)
    assert r.status_code == 201, r.text
    return dict(r.json())


class FlowerTwin:
    """Flower's strategy of the same name, fed the same uploads round by round."""

    def __init__(self, spec: dict[str, object]) -> None:
        from flwr.common import ndarrays_to_parameters
        from flwr.server import strategy

        init = [tiny_model(0)[k].astype(np.float32) for k in sorted(tiny_model(0))]
        hp = {k: v for k, v in spec.items() if k != "name"}
        params = ndarrays_to_parameters(init)
        if spec["name"] == "fedavgm":
            self.s = strategy.FedAvgM(
                initial_parameters=params,
                server_learning_rate=hp.get("eta", 1.0),
                server_momentum=hp.get("momentum", 0.0),
            )
        else:
            cls = {"fedadam": strategy.FedAdam, "fedyogi": strategy.FedYogi}.get(
                str(spec["name"]), strategy.FedAdagrad
            )
            self.s = cls(initial_parameters=params, **hp)

    def round(self, t: int, seeds: list[int], weights: list[int]) -> dict[str, np.ndarray]:
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
        from flwr.common import parameters_to_ndarrays as to_nd

        names = sorted(tiny_model(0))
        res = [
            (
                None,
                FitRes(
                    Status(Code.OK, ""),
                    ndarrays_to_parameters(
                        [tiny_model(s, 3.0)[k].astype(np.float32) for k in names]
                    ),
                    w,
                    {},
                ),
            )
            for s, w in zip(seeds, weights, strict=True)
        ]
        got, _ = self.s.aggregate_fit(t, res, [])
        return dict(zip(names, to_nd(got), strict=True))


def _round(url: str, tokens: dict[str, str], t: int) -> tuple[list[int], list[int]]:
    seeds, weights = [10 * t + i for i in range(3)], [3 + t, 5, 2 * t + 1]
    for c, s, w in zip(CLIENTS, seeds, weights, strict=True):
        upload(url, tokens, c, t, s, w)
    return seeds, weights


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], t: int) -> None:
    for k in FLOAT:
        assert fedavg.rel_error(got[k], want[k]) <= 1e-5, (k, t)


def test_the_sdk_and_the_gateway_name_the_same_metadata_entry() -> None:
    assert SERVER_OPT_KEY == METADATA_KEY


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "fedadam", "eta": 0.05},
        {"name": "fedyogi"},
        {"name": "fedadagrad", "tau": 1e-3},
        {"name": "fedavgm", "eta": 0.8, "momentum": 0.9},
    ],
    ids=lambda s: s["name"],
)
def test_every_published_model_equals_flowers_strategy_and_its_state_is_checkpointed(
    make_gw, minio_server, checkpoints_to, spec: dict[str, object]
) -> None:  # type: ignore[no-untyped-def]
    from core.checkpoints import make_minio

    gw = make_gw(fanout=2, pool=3, **checkpoints_to("opt-test"))
    info = _create(gw.url, gw.gw.secret, spec, rounds=3)
    twin = FlowerTwin(spec)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for t in (1, 2, 3):
            seeds, weights = _round(gw.url, info["tokens"], t)
            _same(wait_version(gw.url, info["tokens"]["c0"], t), twin.round(t, seeds, weights), t)
        job = gw.gw.jobs["j1"]
        # the model and the state are all the job holds: each step's inputs were freed
        assert sorted(job.ns.keys()) == sorted(
            k.hex() for k in [job.global_key, *job.opt_keys.values()]
        )
        assert gw.gw.checkpoints.flush(60)
        mc = make_minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
        opt, state, rnd = state_from_safetensors(
            mc.get_object("opt-test", "j1/rounds/000003/server_opt.safetensors").read()
        )
        assert (opt.to_json()["name"], rnd, set(state)) == (spec["name"], 3, set(opt.state_names))
        for n, k in job.opt_keys.items():
            with job.ns.open(k) as o:
                np.testing.assert_array_equal(state[n], wire.flat_view(o.buf, job.spec))
    finally:
        aggs.stop()


def test_a_resumed_job_continues_with_its_optimizers_checkpointed_state(
    make_gw, checkpoints_to
) -> None:  # type: ignore[no-untyped-def]
    spec = {"name": "fedadam", "eta": 0.05}
    gw = make_gw(fanout=2, pool=3, **checkpoints_to("opt-resume"))
    info = _create(gw.url, gw.gw.secret, spec, rounds=3)
    twin = FlowerTwin(spec)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for t in (1, 2):
            seeds, weights = _round(gw.url, info["tokens"], t)
            _same(wait_version(gw.url, info["tokens"]["c0"], t), twin.round(t, seeds, weights), t)
        # the checkpoint holds the model and the optimizer: no body
        tokens = delete_and_resume(gw, CLIENTS, 3, goal=3)["tokens"]
        assert gw.gw.jobs["j1"].server_opt is not None and gw.gw.jobs["j1"].version == 2
        seeds, weights = _round(gw.url, tokens, 3)
        _same(wait_version(gw.url, tokens["c0"], 3), twin.round(3, seeds, weights), 3)
    finally:
        aggs.stop()


def test_a_node_taking_the_job_over_adopts_the_state_from_minio(
    make_gw, tmp_path: Path, checkpoints_to
) -> None:  # type: ignore[no-untyped-def]
    kw = dict(
        fanout=2,
        pool=3,
        admin_secret_file=tmp_path / "admin-secret",  # node gateways share the admin secret
        **checkpoints_to("opt-takeover"),
    )
    a = make_gw(node="a", **kw)
    b = make_gw(node="b", peers={"a": a.url}, **kw)
    spec = {"name": "fedyogi", "eta": 0.02}
    info = _create(a.url, a.gw.secret, spec, rounds=3, nodes="a,b")
    wait_until(lambda: "j1" in b.gw.jobs)
    node_of = info["plan"]["client_nodes"]
    twin = FlowerTwin(spec)
    aggs_a, aggs_b = Aggregators(a), Aggregators(b)
    try:
        aggs_a.start(2)
        aggs_b.start(2)
        seeds, weights = [11, 12, 13], [4, 5, 3]
        for c, sd, w in zip(CLIENTS, seeds, weights, strict=True):
            upload(a.url if node_of[c] == "a" else b.url, info["tokens"], c, 1, sd, w)
        want = twin.round(1, seeds, weights)
        _same(wait_version(a.url, info["tokens"]["c0"], 1), want, 1)
        job_a = a.gw.jobs["j1"]
        state_a = {}
        for n, k in job_a.opt_keys.items():
            with job_a.ns.open(k) as o:
                state_a[n] = wire.flat_view(o.buf, job_a.spec).copy()
        _same(wait_version(b.url, info["tokens"]["c0"], 1), want, 1)  # b fetched model 1
        assert a.gw.checkpoints.flush(60)
        aggs_a.stop()
        a.stop()  # the root is gone with its store
        r = httpx.post(
            b.url + "/v1/jobs/j1/adopt",
            json={"from": "a"},
            headers={"Authorization": f"Bearer {b.gw.secret}"},
        )
        assert r.status_code == 200, r.text
        job_b = b.gw.jobs["j1"]
        assert set(job_b.opt_keys) == set(state_a) == {"m", "v"}
        for n, k in job_b.opt_keys.items():
            with job_b.ns.open(k) as o:
                np.testing.assert_array_equal(wire.flat_view(o.buf, job_b.spec), state_a[n])
    finally:
        aggs_a.stop()
        aggs_b.stop()


def test_a_sigkilled_root_resumes_the_state_it_journaled(tmp_path: Path, redis_url: str) -> None:
    shm = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    port = free_port()
    gw = _gateway(tmp_path, redis_url, port, shm)
    url = f"http://127.0.0.1:{port}"
    secret = (tmp_path / "state" / "admin-secret").read_text().strip()
    spec = {"name": "fedadam", "eta": 0.05}
    info = _create(url, secret, spec, rounds=2)
    twin = FlowerTwin(spec)
    aggs = _aggregators(tmp_path, url)
    aggs.spawn(2)
    try:
        aggs.wait_registered(2)
        seeds, weights = _round(url, info["tokens"], 1)
        _same(wait_version(url, info["tokens"]["c0"], 1), twin.round(1, seeds, weights), 1)
        _kill(gw, signal.SIGKILL)
        gw = _gateway(tmp_path, redis_url, port, shm)  # same store and journal
        seeds, weights = _round(url, info["tokens"], 2)
        _same(wait_version(url, info["tokens"]["c0"], 2), twin.round(2, seeds, weights), 2)
    finally:
        _kill(gw, signal.SIGTERM)
        aggs.stop()
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ('{"name": "sgd"}', "unknown"),
        ('{"name": "fedadam", "eta": -1}', "eta"),
        ('{"name": "fedadam", "momentum": 0.9}', "momentum"),
        ('{"name": "fedyogi", "tau": 0}', "tau"),
        ("not json", "server_opt"),
    ],
)
def test_a_bad_optimizer_is_refused_with_what_to_change_and_nothing_is_created(
    make_gw, spec: str, says: str
) -> None:  # type: ignore[no-untyped-def]
    assert_job_refused(make_gw(), CLIENTS, {SERVER_OPT_KEY: spec}, "bad_server_opt", says)
