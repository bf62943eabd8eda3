"""LIFL -> FLStore: a round the gateway aggregates is checkpointed, announced to the cache engine,
and answerable by the request tracker from cache functions that already hold it."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from core import wire
from tests.flstore.conftest import start_stack
from tests.flstore.gateway_round import CLIENTS, one_round, stack_gateway
from tests.flstore.tracker_queries import ask, direct_answer
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`
JOB = "lifl2fls"


def _model(base: dict[str, np.ndarray], delta: np.ndarray, sign: float) -> bytes:
    flat = np.concatenate([base["layer.bias"], base["layer.weight"].ravel()])
    moved = flat + sign * delta
    return wire.encode_tensors(
        {"layer.bias": moved[:8], "layer.weight": moved[8:].reshape(8, 5), "steps": base["steps"]}
    )


def test_aggregated_round_flows_into_flstore_and_a_sign_flipper_is_flagged(
    make_gw, tmp_path: Path, redis_server, minio_server
) -> None:  # type: ignore[no-untyped-def]
    stack = start_stack(tmp_path / "flstore", redis_server, minio_server, {"secondaries": 1})
    try:
        gw = stack_gateway(make_gw, stack, minio_server, fanout=2, pool=4)
        rng = np.random.default_rng(7)
        base = _base()
        direction = rng.standard_normal(48)

        def update(c: str) -> bytes:  # c3 sends the honest direction reversed
            sign = -1.0 if c == "c3" else 1.0
            return _model(base, direction + 0.1 * rng.standard_normal(48), sign)

        one_round(gw, JOB, _model(base, np.zeros(48), 0), update)
        query = {
            "workload": "cosine-to-aggregate",
            "job": JOB,
            "rounds": [1],
            "params": {"bottom_k": 1},
        }
        rec = ask(stack, query)
        assert rec["status"] == "done" and rec["hit"] is True  # hot before the query came
        assert rec["result"]["flagged"] == ["c3"]
        # the cache functions mapped the round's updates in the gateway's store (zero-copy
        # handoff), each copy under its own lease, and answer as the MinIO copies do
        stack.wait_idle()  # the engine ended the offer once the round's placement claimed it
        stats = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()["stats"]
        lent = stats["objects_handed_off"]
        assert lent in (len(CLIENTS), 2 * len(CLIENTS)), stats  # the primary's, a secondary's
        assert stats["offers_ended"] == 1, stats
        handoff = gw.gw.handoff
        assert handoff is not None and handoff.leases() == lent  # the offer's own went back
        direct = direct_answer(stack, minio_server, query)
        assert rec["result"]["cosine"] == pytest.approx(direct["cosine"], rel=1e-6)
        assert rec["result"]["ranking"] == direct["ranking"]
    finally:
        stack.stop()
    # the functions died: their leases went back with their connections
    # nothing keeps the round's updates in the store any more
    wait_until(lambda: handoff.leases() == 0, 10, "the functions' leases to go back")


def _base() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "layer.weight": rng.standard_normal((8, 5)).astype(np.float32),
        "layer.bias": rng.standard_normal(8).astype(np.float32),
        "steps": np.array([0], np.int64),
    }
