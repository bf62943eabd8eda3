"""Masked uint32 vectors through a real gateway and real aggregator replicas: decoded once into
the store as the raw uint32 they are (wire dtype ``U32``), folded eagerly in Z_2^32 on the
leaf/middle/top path FedAvg takes, never divided. The gateway holds the masked sum until it gets
the round's adverts and shares (``POST /v1/jobs/{job}/rounds/{r}/unmask``, what the control
plane sends), then publishes exactly the survivors' quantized FedAvg, dequantized; no update or
partial the gateway or the replicas stored is distinguishable from uniform bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from core import wire
from core.auth import bearer
from core.objstore import StoreError
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator
from gateway import Gateway
from gateway.secagg import METADATA_KEY
from tests.aggregators import Aggregators
from tests.dataplane.gateways import gateway_extra, make_gw  # noqa: F401  (the gateway fixtures)
from tests.dataplane.gwutil import GatewayThread
from tests.dataplane.rounds import post_update, wait_version
from tests.polling import wait_until
from tests.secagg.rounds import UNIFORM_P, D, looks_uniform, run_round

pytestmark = pytest.mark.integration

N = 10
DROPPED = (3, 7)  # masked their vectors, which never reached the server
#: the ids of tests.secagg.rounds' clients that reach the gateway
CLIENTS = [f"client-{i:02d}" for i in range(N) if i not in DROPPED]
CONFIG = SecAggConfig(neighbours=6)


def _node(gw: GatewayThread) -> Gateway:
    assert gw.gw is not None
    return gw.gw


def _masked_job_request(
    gw: GatewayThread, metadata: dict[str, str] | None = None
) -> httpx.Response:
    """``POST /v1/jobs`` of a job whose model is one masked vector (``U32``, the weight
    coordinate included), ``metadata`` in its header."""
    meta = {METADATA_KEY: json.dumps(CONFIG.to_spec()), **(metadata or {})}
    body = wire.encode_tensors({"masked": np.zeros(D + 1, np.uint32)}, meta)
    return httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=body,
        headers=bearer(_node(gw).secret),
    )


def _create_masked_job(gw: GatewayThread) -> dict[str, str]:
    """The masked job created; its clients' tokens."""
    r = _masked_job_request(gw)
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def _stored(gw: GatewayThread, kinds: set[int]) -> dict[str, tuple[int, bytes]]:
    """The masked vectors (or sums) in the job's sealed store objects of header ``kinds``,
    by key: ``(header kind, bytes)``."""
    ns = _node(gw).jobs["j1"].ns
    out = {}
    for key in ns.keys():  # noqa: SIM118  (a Namespace is no mapping)
        try:
            obj = ns.open(bytes.fromhex(key))
        except StoreError:
            continue  # an object still written: an accumulator
        with obj:
            kind = wire.read_header(obj.buf).kind
            if kind in kinds:
                # the vector, not the zero padding that ends the object
                out[key] = kind, bytes(obj.buf[wire.HEADER_SIZE : wire.HEADER_SIZE + 4 * (D + 1)])
    return out


def _kill_after_a_checkpoint(gw: GatewayThread, aggs: Aggregators) -> Callable[[], int]:
    """Kill every replica once a parent parked on its checkpoint, start a fresh one; a call
    that says how many times that parent's slot has been run."""
    eng = _node(gw).jobs["j1"].engine
    assert eng is not None

    def parked() -> list[int]:
        return [i for i, s in eng.slots.items() if s.ckpt is not None and s.endpoint is None]

    slot = wait_until(parked, what="a parent parked on its checkpoint")[0]
    for pid in set(aggs.endpoints().values()):
        aggs.kill_pid(pid)
    aggs.spawn(1)
    return lambda: eng.slots[slot].attempts


@pytest.mark.parametrize(
    ("fanout", "lazy", "kill"), [(3, False, False), (2, True, False), (2, False, True)]
)
def test_replicas_fold_masked_vectors_into_the_exact_quantized_fedavg(
    make_gw: Callable[..., GatewayThread],  # noqa: F811
    fanout: int,
    lazy: bool,
    kill: bool,
) -> None:
    """``kill``: once the first leaf's partial is folded into its parent's checkpoint (the
    parent parked), every replica is killed and a fresh one re-runs the parent from its
    checkpoint, read in place as a masked sum, folding the next partial into a spare."""
    gw = make_gw(fanout=fanout, lazy=lazy, pool=3)
    tokens = _create_masked_job(gw)
    aggs = Aggregators(gw)
    seen: dict[str, tuple[int, bytes]] = {}  # every update and partial found in the store
    attempts: list[Callable[[], int]] = []  # kill: the parked parent's runs

    def through_gateway(vectors: list[np.ndarray]) -> np.ndarray:
        """The server's fold: each masked vector uploaded by a client, the round's published
        model read back (the masked sum), the stored updates and partials kept for the check."""
        assert len(vectors) == len(CLIENTS)
        for c, vec in zip(CLIENTS, vectors, strict=True):
            # the samples header is a frame's weight only: the weight is inside the vector
            r = post_update(gw.url, "j1", 1, tokens[c], c, wire.encode_tensors({"masked": vec}))
            assert r.status_code == 202, r.text
            seen.update(_stored(gw, {wire.KIND_UPDATE, wire.KIND_PARTIAL}))
            if kill and c == CLIENTS[fanout - 1]:  # the first leaf is full
                attempts.append(_kill_after_a_checkpoint(gw, aggs))
        return np.zeros(D + 1, np.uint32)  # the sum stays on the gateway, which unmasks it

    def at_the_root(server: Coordinator, messages: dict[str, dict[str, Any]]) -> np.ndarray:
        """What the control plane does: ask which vectors the sum holds, send the adverts, who
        shared and the survivors' shares; the published model is the unmasked FedAvg."""
        url = f"{gw.url}/v1/jobs/j1/rounds/1/unmask"
        admin = bearer(_node(gw).secret)
        state = wait_until(
            lambda: (r := httpx.get(url, headers=admin).json())["state"] == "waiting" and r,
            what="the masked sum waiting for its shares",
        )
        assert state["masked"] == CLIENTS
        material = {
            "adverts": {c: a.to_json() for c, a in server.adverts.items()},
            "shared": sorted(server.shared),
            "shares": messages,
        }
        r = httpx.post(url, json=material, headers=admin, timeout=60)
        assert r.status_code == 200, r.text
        got = wait_version(gw.url, tokens[CLIENTS[0]], 1)
        assert set(got) == {"fedavg"} and got["fedavg"].dtype == np.float32
        assert httpx.get(url, headers=admin).json()["state"] == "published"
        return got["fedavg"]

    try:
        aggs.start(2)
        out = run_round(
            CONFIG,
            N,
            drop_after_masking=DROPPED,
            fold=through_gateway,
            unmask=at_the_root,
            job="j1",
            round_=1,
        )
        np.testing.assert_array_equal(out.got, out.want)
        assert all(runs() >= 2 for runs in attempts) and len(attempts) == int(kill)
        job = _node(gw).jobs["j1"]
        assert job.global_key is not None
        with job.ns.open(job.global_key) as obj:
            h = wire.read_header(obj.buf)
            assert h.count == len(CLIENTS)  # every masked vector folded exactly once
        sent = {v.tobytes() for v in out.vectors}
        updates = [data for kind, data in seen.values() if kind == wire.KIND_UPDATE]
        # the first update waits in the store for its leaf's other inputs: at least it was seen,
        # and each update seen is its client's vector as uploaded (copied, not converted)
        assert updates and all(data in sent for data in updates)
        for key, (_, data) in seen.items():
            assert looks_uniform(data) > UNIFORM_P, key
    finally:
        aggs.stop()


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("fedfaas.aggregation", {"rule": "median"}, "aggregation: robust rules"),
        ("fedfaas.async", {"max_staleness": 2, "eta": 0.8}, "fedbuff: FedBuff weights"),
        ("core.server_opt", {"name": "fedadam"}, "server_opt: a server optimizer"),
        ("fedfaas.evaluator", {"kind": "digits-softmax"}, "evaluator: an evaluator"),
    ],
)
def test_a_masked_job_refuses_what_reads_individual_updates_or_floats(
    make_gw: Callable[..., GatewayThread],  # noqa: F811
    key: str,
    value: dict[str, object],
    says: str,
) -> None:
    gw = make_gw()
    r = _masked_job_request(gw, {key: json.dumps(value)})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_secure_aggregation" and says in r.json()["detail"]
    assert "U32" in r.json()["detail"]
    assert "j1" not in _node(gw).jobs
    # the same option on a float model is no business of secure aggregation's
    body = wire.encode_tensors({"w": np.zeros(4, np.float32)}, {key: json.dumps(value)})
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j2", "rounds": 1, "goal": 3, "clients": "a,b,c"},
        content=body,
        headers=bearer(_node(gw).secret),
    )
    assert r.json().get("error") != "bad_secure_aggregation", r.text


def test_a_float_upload_to_a_masked_job_is_refused_with_what_is_wrong(
    make_gw: Callable[..., GatewayThread],  # noqa: F811
) -> None:
    gw = make_gw()
    tokens = _create_masked_job(gw)
    floats = wire.encode_tensors({"masked": np.zeros(D + 1, np.float32)})
    r = post_update(gw.url, "j1", 1, tokens[CLIENTS[0]], CLIENTS[0], floats)
    assert r.status_code == 400, r.text
    assert "U32" in r.json()["detail"] and "F32" in r.json()["detail"]
    eng = _node(gw).jobs["j1"].engine
    assert eng is not None and not eng.clients  # nothing of it was accepted
    # and the client may still send its masked vector
    masked = wire.encode_tensors({"masked": np.arange(D + 1, dtype=np.uint32)})
    r = post_update(gw.url, "j1", 1, tokens[CLIENTS[0]], CLIENTS[0], masked)
    assert r.status_code == 202, r.text
    assert set(eng.clients) == {CLIENTS[0]}


@pytest.mark.parametrize(
    ("tensors", "metadata", "says"),
    [
        ({"masked": np.zeros(D + 1, np.uint32)}, {}, "declare its parameters"),
        ({"w": np.zeros(D + 1, np.float32)}, {METADATA_KEY: "{}"}, "must be of U32 tensors"),
        ({"masked": np.zeros(D + 1, np.uint32)}, {METADATA_KEY: '{"bits": 40}'}, "bits must be"),
        ({"masked": np.zeros(D + 1, np.uint32)}, {METADATA_KEY: '{"clip": 1'}, METADATA_KEY),
        ({"masked": np.zeros(D + 1, np.uint32)}, {METADATA_KEY: '{"mask": 1}'}, "unknown"),
    ],
)
def test_a_secure_aggregation_job_needs_masked_tensors_and_sound_parameters(
    make_gw: Callable[..., GatewayThread],  # noqa: F811
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str],
    says: str,
) -> None:
    gw = make_gw()
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 3, "clients": "a,b,c"},
        content=wire.encode_tensors(tensors, metadata),
        headers=bearer(_node(gw).secret),
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_secure_aggregation" and says in r.json()["detail"], r.text
    assert "j1" not in _node(gw).jobs


def test_a_round_too_small_for_secure_aggregation_is_refused(
    make_gw: Callable[..., GatewayThread],  # noqa: F811
) -> None:
    gw = make_gw()
    meta = {METADATA_KEY: json.dumps(CONFIG.to_spec())}
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 2, "clients": "a,b"},
        content=wire.encode_tensors({"masked": np.zeros(D + 1, np.uint32)}, meta),
        headers=bearer(_node(gw).secret),
    )
    assert r.status_code == 400 and "at least 3 clients" in r.json()["detail"], r.text
