"""A round too large for one cache function, still in its root gateway's store: the cache
functions on that node map their parts in place (no copy, no MinIO read), one lease per
update each, and the round's answer is the MinIO copies' answer. On a real gateway, real
aggregators, the real runtime, engine, tracker and MinIO."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from core import wire
from tests.dataplane.gateways import gateway_extra, make_gw  # noqa: F401 (the gateway fixtures)
from tests.polling import wait_until

from .conftest import start_stack
from .gateway_round import CLIENTS, one_round, stack_gateway
from .tracker_queries import ask, direct_answer

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`
JOB = "parts-in-place"
SIZE = 8 * 40 + 8  # floats of the model: 1.3 KB


def _model(base: dict[str, np.ndarray], delta: np.ndarray) -> bytes:
    flat = np.concatenate([base["layer.bias"], base["layer.weight"].ravel()]) + delta
    return wire.encode_tensors(
        {"layer.bias": flat[:8], "layer.weight": flat[8:].reshape(8, 40), "steps": base["steps"]}
    )


def test_a_round_in_parts_is_mapped_in_place_from_the_gateways_store(
    make_gw,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    redis_server,
    minio_server,
) -> None:  # type: ignore[no-untyped-def]
    # 4 updates and the base model take 6.5 KB, a function 4 KB: the round goes in parts
    stack = start_stack(
        tmp_path / "flstore",
        redis_server,
        minio_server,
        {"secondaries": 0, "function_capacity_bytes": 4096},
    )
    try:
        gw = stack_gateway(make_gw, stack, minio_server, fanout=2, pool=4)
        rng = np.random.default_rng(3)
        base = {
            "layer.weight": rng.standard_normal((8, 40)).astype(np.float32),
            "layer.bias": rng.standard_normal(8).astype(np.float32),
            "steps": np.array([0], np.int64),
        }
        direction = rng.standard_normal(SIZE)

        def update(c: str) -> bytes:  # c3 sends the honest direction reversed
            sign = -1.0 if c == "c3" else 1.0
            return _model(base, sign * (direction + 0.1 * rng.standard_normal(SIZE)))

        one_round(gw, JOB, _model(base, np.zeros(SIZE)), update)
        query = {"workload": "multi-krum", "job": JOB, "rounds": [1], "params": {"f": 1}}
        rec = ask(stack, query)
        assert rec["result"]["flagged"] == ["c3"]
        stack.wait_idle()
        state = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        assert state["stats"]["queries_in_parts"] >= 1, state["stats"]
        parts_held = [
            o["id"]
            for f in state["functions"]
            for o in httpx.get(
                f"{stack.runtime_url}/function/{f}/objects", headers=stack.function_auth
            ).json()["objects"]
            if "~" in o["id"] and "/1/c" in o["id"]
        ]
        assert parts_held, state
        # every update part the functions hold was mapped from the gateway's store
        assert state["stats"]["objects_handed_off"] >= len(parts_held)
        handoff = gw.gw.handoff
        assert handoff is not None and 0 < handoff.leases() <= len(CLIENTS) * len(
            state["functions"]
        )  # one per update and function that maps a part of it; the offer's own ended
        direct = direct_answer(stack, minio_server, query)
        assert rec["result"]["scores"] == pytest.approx(direct["scores"], rel=1e-6)
    finally:
        stack.stop()
    wait_until(lambda: handoff.leases() == 0, 10, "the functions' leases to go back")
