"""The aggregator function's HTTP contract: status, one-shot aggregate, clear 4xx on bad input."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from fedfaas import fedavg, wire
from fedfaas.objstore import Namespace

from .handler import handle


def _event(method, body=b""):
    return SimpleNamespace(method=method, body=body, headers={}, query={}, path="/")


def test_get_reports_this_replicas_endpoints():
    res = handle(_event("GET"), SimpleNamespace(hostname="agg-0"))
    assert res["statusCode"] == 200 and res["body"]["pid"] == os.getpid()
    assert isinstance(res["body"]["endpoints"], list)


def test_one_shot_aggregate_of_sealed_objects_is_fedavg():
    spec = wire.ModelSpec.build([("w", "F32", (1000,))])
    ns = Namespace(
        Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}", "n", "j", spec.object_nbytes
    )
    try:
        rng = np.random.default_rng(0)
        ups, weights, keys = [], [3.0, 5.0, 7.0], []
        for w in weights:
            u = rng.standard_normal(1000).astype(np.float32)
            obj = ns.allocate()
            wire.tensor_views(obj.buf, spec)["w"][:] = u
            wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=w, count=1, round=1)
            obj.close()
            ns.seal(obj.key)
            ups.append(u)
            keys.append(obj.key)
        req = {"action": "aggregate", "store": str(ns.path), "keys": keys}
        res = handle(_event("POST", json.dumps(req).encode()), SimpleNamespace(hostname="h"))
        assert res["statusCode"] == 200, res
        want = fedavg.fedavg_reference(ups, weights)
        assert res["body"]["count"] == 3 and res["body"]["weight"] == 15.0
        assert fedavg.rel_error(res["body"]["head"], want[:8]) <= 1e-6
        assert abs(res["body"]["l2"] - float(np.linalg.norm(want))) <= 1e-5 * float(
            np.linalg.norm(want)
        )
    finally:
        ns.close()


def test_bad_requests_are_4xx_with_a_reason():
    assert handle(_event("POST", b"{not json"), None)["statusCode"] == 400
    assert handle(_event("POST", b'{"action": "dance"}'), None)["body"]["error"] == "bad_action"
    res = handle(
        _event(
            "POST",
            json.dumps(
                {"action": "aggregate", "store": "/nonexistent", "keys": ["00" * 16]}
            ).encode(),
        ),
        None,
    )
    assert res["statusCode"] in (400, 404)
