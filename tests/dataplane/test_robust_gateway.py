"""Robust rules on real gateways (issue 15, items 1 and 2): a job declaring a rule keeps its
round's updates in the node's store, the gateway runs the rule as coordinate shards on real
``aggregator`` endpoints (the update slices read in place, the result written by range into one
object), and every published model equals the numpy reference and Flower's strategy on the same
uploads; the decision goes into the round's ``meta.json``; bad specs are refused."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from client.sdk import with_metadata
from core import robust, wire
from core.robust import METADATA_KEY, RobustRule
from tests.aggregators import Aggregators
from tests.dataplane.rounds import post_update, wait_version

pytestmark = pytest.mark.integration

CLIENTS = [f"c{i}" for i in range(8)]
BAD = {"c0", "c3"}  # sign-flipped, scaled deltas


def _model(rng: np.random.Generator, base: dict[str, np.ndarray] | None = None, bad=False):
    if base is None:
        return {
            "fc.weight": rng.standard_normal((60, 50)).astype(np.float32),
            "fc.bias": rng.standard_normal(50).astype(np.float32),
        }
    out = {}
    for k, v in base.items():
        delta = (0.1 + 0.05 * rng.standard_normal(v.shape)).astype(np.float32)
        out[k] = (v - 100 * delta if bad else v + delta).astype(np.float32)
    return out


def _flat(m: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([m[k].ravel() for k in sorted(m)])


def _create(url: str, secret: str, spec: object, nodes: str = "", job: str = "j1"):
    body = with_metadata(
        wire.encode_tensors(_model(np.random.default_rng(0))),
        {METADATA_KEY: json.dumps(spec)},
    )
    params = {"job": job, "rounds": 2, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)}
    if nodes:
        params["nodes"] = nodes
    return httpx.post(
        url + "/v1/jobs",
        params=params,
        content=body,
        headers={"Authorization": f"Bearer {secret}"},
    )


def _upload(
    url: str, token: str, client: str, rnd: int, model, samples: int, job: str = "j1"
) -> None:
    r = post_update(url, job, rnd, token, client, wire.encode_tensors(model), samples)
    assert r.status_code == 202, r.text


def _one_round(gw, spec: object, job: str, ups: dict) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Job ``job`` with rule ``spec`` on the gateway ``gw``, round 1 uploaded by every client
    (10 samples each), run on one replica's two endpoints: the published model."""
    made = _create(gw.url, gw.gw.secret, spec, job=job)
    assert made.status_code == 201, made.text
    tokens = made.json()["tokens"]
    aggs = Aggregators(gw)
    try:
        aggs.start(1, endpoints=2)
        for c in CLIENTS:
            _upload(gw.url, tokens[c], c, 1, ups[c], 10, job=job)
        return wait_version(gw.url, tokens["c1"], 1, job=job)  # type: ignore[no-any-return]
    finally:
        aggs.stop()


SPECS = [
    {"rule": "median"},  # shards: one per registered endpoint (2)
    {"rule": "median", "shards": 3},
    {"rule": "trimmed-mean", "beta": 0.25, "shards": 3},
    {"rule": "krum", "f": 2, "shards": 3},
    {"rule": "multi-krum", "f": 2, "shards": 3},
    {"rule": "fltrust", "root_client": "c7", "shards": 3},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['rule']}-{s.get('shards', 'auto')}")
def test_each_rule_runs_sharded_on_real_endpoints_and_equals_the_reference(
    make_gw, minio_server, checkpoints_to, spec
) -> None:  # type: ignore[no-untyped-def]
    from core.checkpoints import make_minio

    bucket = f"robust-{spec['rule']}-{spec.get('shards', 0)}"
    gw = make_gw(fanout=2, pool=4, **checkpoints_to(bucket))
    r = _create(gw.url, gw.gw.secret, spec)
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    rule = RobustRule.from_json(spec)
    rng = np.random.default_rng(1)
    g = _model(np.random.default_rng(0))
    aggs = Aggregators(gw)
    try:
        aggs.start(1, endpoints=2)
        for rnd in (1, 2):
            ups = {c: _model(rng, g, bad=c in BAD) for c in CLIENTS}
            samples = {c: 10 + i for i, c in enumerate(CLIENTS)}
            for c in CLIENTS:
                _upload(gw.url, tokens[c], c, rnd, ups[c], samples[c])
            got = _flat(wait_version(gw.url, tokens["c1"], rnd))
            root = CLIENTS.index("c7") if rule.rule == "fltrust" else None
            want = robust.reference(
                rule,
                [_flat(ups[c]) for c in CLIENTS],
                _flat(g),
                [samples[c] for c in CLIENTS],
                root,
            )
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            honest = np.mean([_flat(ups[c]) for c in CLIENTS if c not in BAD], axis=0)
            assert robust.far(got - _flat(g), honest - _flat(g)) < 0.5
            g = {
                k: v.copy()
                for k, v in wire.decode_tensors(
                    wire.encode_tensors(
                        dict(
                            zip(
                                sorted(g),
                                np.split(got, np.cumsum([g[k].size for k in sorted(g)])[:-1]),
                                strict=True,
                            )
                        )
                    )
                ).items()
            }
            g = {k: v.reshape(_model(np.random.default_rng(0))[k].shape) for k, v in g.items()}
        job = gw.gw.jobs["j1"]
        eng = job.engine
        # every shard ran on an endpoint of the replica; the job holds only its model now
        assert sorted(job.ns.keys()) == [job.global_key.hex()]
        assert gw.gw.checkpoints.flush(60)
        mc = make_minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
        meta = json.loads(mc.get_object(bucket, "j1/rounds/000002/meta.json").read())
        agg = meta["aggregation"]
        assert (
            agg["rule"] == rule.to_json()
            and agg["shards"] == spec.get("shards", 2)
            and agg["clients"] == CLIENTS
        )
        if rule.rule in ("krum", "multi-krum"):
            assert not BAD & set(agg["selected"]) and agg["aggregated"] == agg["selected"]
            assert len(agg["selected"]) == (1 if rule.rule == "krum" else len(CLIENTS) - 2)
        if rule.rule == "fltrust":
            assert agg["root"] == "c7" and all(agg["trust"][c] == 0 for c in BAD)
            assert set(agg["aggregated"]) == set(CLIENTS) - BAD - {"c7"}
        assert eng is None  # the job's two rounds are done
    finally:
        aggs.stop()


def test_median_and_krum_equal_flowers_strategies_on_the_same_uploads(make_gw) -> None:  # type: ignore[no-untyped-def]
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedMedian, Krum

    rng = np.random.default_rng(5)
    g = _model(np.random.default_rng(0))
    ups = {c: _model(rng, g, bad=c in BAD) for c in CLIENTS}
    res = [
        (
            None,
            FitRes(
                Status(Code.OK, ""), ndarrays_to_parameters([ups[c][k] for k in sorted(g)]), 10, {}
            ),
        )
        for c in CLIENTS
    ]
    for node, spec, strategy in [
        ("m", {"rule": "median", "shards": 2}, FedMedian()),
        ("k", {"rule": "krum", "f": 2, "shards": 2}, Krum(num_malicious_clients=2)),
    ]:
        got = _one_round(make_gw(node=node, fanout=2, pool=4), spec, node, ups)
        want, _ = strategy.aggregate_fit(1, res, [])
        for k, w in zip(sorted(g), parameters_to_ndarrays(want), strict=True):
            np.testing.assert_array_equal(got[k], w)


@pytest.mark.parametrize(
    ("spec", "nodes", "says"),
    [
        ({"rule": "mean"}, "", "unknown"),
        ({"rule": "krum", "f": "two"}, "", "integer"),
        ("median", "", "JSON object"),
        ({"rule": "median"}, "n0,n1", "on one node"),
    ],
)
def test_bad_aggregation_specs_are_refused_before_anything_is_created(
    make_gw, spec, nodes, says
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(node="n0")
    r = _create(gw.url, gw.gw.secret, spec, nodes=nodes)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_aggregation" and says in r.json()["detail"], r.json()
    assert "j1" not in gw.gw.jobs


def test_the_sdk_and_the_gateway_name_the_same_metadata_entry() -> None:
    from client.sdk import AGGREGATION_KEY

    assert AGGREGATION_KEY == METADATA_KEY


def test_dp_fedavg_clips_on_the_path_and_adds_the_seeded_noise_of_the_configured_std(
    make_gw, minio_server, checkpoints_to
) -> None:  # type: ignore[no-untyped-def]
    """Issue 15, item 3 on a real gateway and endpoints: the Gram pass gives the norms, the
    two poisoned updates are clipped (meta.json counts them, naming no client's norm), the
    published model is ``g + (sum of clipped deltas +
    noise) / goal`` with the noise of std ``z C / goal`` drawn from the seed ``meta.json``
    records (regenerated here bit for bit), and the same uploads without noise equal Flower's
    ``DifferentialPrivacyServerSideFixedClipping`` around FedAvg."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from core.checkpoints import make_minio

    clip, z, goal = 2.0, 0.8, len(CLIENTS)
    rng = np.random.default_rng(7)
    g = _model(np.random.default_rng(0))
    ups = {c: _model(rng, g, bad=c in BAD) for c in CLIENTS}
    flat = [_flat(ups[c]) for c in CLIENTS]
    for spec, bucket in [
        ({"rule": "dp-fedavg", "clip": clip, "noise_multiplier": z, "seed": 11}, "dp-noisy"),
        ({"rule": "dp-fedavg", "clip": clip, "noise_multiplier": 0.0, "shards": 3}, "dp-exact"),
    ]:
        gw = make_gw(node=bucket.replace("-", ""), fanout=2, pool=4, **checkpoints_to(bucket))
        got = _flat(_one_round(gw, spec, bucket, ups))
        rule = RobustRule.from_json(spec)
        want = robust.reference(rule, flat, _flat(g), [10] * goal, expected=goal)
        assert gw.gw.checkpoints.flush(60)
        mc = make_minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
        agg = json.loads(mc.get_object(bucket, f"{bucket}/rounds/000001/meta.json").read())[
            "aggregation"
        ]
        norms = {
            c: float(np.linalg.norm(f.astype(np.float64) - _flat(g)))
            for c, f in zip(CLIENTS, flat, strict=True)
        }
        clipped = sorted(c for c in CLIENTS if norms[c] > clip)
        assert set(clipped) >= BAD and agg["clipped"] == len(clipped)  # a count, not who
        assert "norms" not in agg and "scores" not in agg
        assert agg["denominator"] == goal and agg["noise_std"] == pytest.approx(
            rule.noise_multiplier * clip / goal
        )
        if rule.noise_multiplier:
            # the noise: its std, and exactly the draws of the recorded seed, shard by shard
            noise = got.astype(np.float64) - want
            assert abs(noise.std() / (z * clip / goal) - 1) < 0.1
            # the shards cover the store object's data region (tensors 64-byte aligned)
            layout = wire.ModelSpec.build([(k, "F32", v.shape) for k, v in g.items()])
            region = np.empty(layout.data_nbytes // 4)
            bounds = robust.shard_bounds(region.size, 2)
            seeded = robust.Noise(z * clip / goal, int(agg["noise_seed"]))
            for a, b in zip(bounds, bounds[1:], strict=False):
                draws = seeded.generator(a)
                for lo in range(a, b, robust.BLOCK):
                    hi = min(lo + robust.BLOCK, b)
                    region[lo:hi] = seeded.std * draws.standard_normal(hi - lo)
            redrawn = np.concatenate(
                [region[(t.offset - wire.HEADER_SIZE) // 4 :][: t.numel] for t in layout.tensors]
            )
            np.testing.assert_allclose(
                got, (want + redrawn).astype(np.float32), rtol=1e-6, atol=1e-6
            )
            continue
        assert "noise_seed" not in agg
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        flower = DifferentialPrivacyServerSideFixedClipping(
            FedAvg(), noise_multiplier=0.0, clipping_norm=clip, num_sampled_clients=goal
        )
        flower.current_round_params = [g[k] for k in sorted(g)]
        res = [
            (
                None,
                FitRes(
                    Status(Code.OK, ""),
                    ndarrays_to_parameters([ups[c][k] for k in sorted(g)]),
                    10,
                    {},
                ),
            )
            for c in CLIENTS
        ]
        out, _ = flower.aggregate_fit(1, res, [])
        assert out is not None
        fl = np.concatenate([a.ravel() for a in parameters_to_ndarrays(out)])
        np.testing.assert_allclose(got, fl, rtol=1e-5, atol=1e-6)
