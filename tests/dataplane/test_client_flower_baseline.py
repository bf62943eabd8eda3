"""The Flower peer of the round benchmark (bench.flower_baseline), on a small payload: Flower
1.42 in its own environment (bench.harness.flower_env, made on first use), its Deployment
Runtime and Message API. Slow: a Flower 1.42 deployment starts three processes per client and
its ServerApp polls every 3 s (about 30 s for this round)."""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow
@pytest.mark.integration
def test_a_real_flower_round_reports_its_windows_and_server_memory() -> None:
    from bench.flower_baseline import run_flower_round
    from bench.harness.round_clients import resnet18_layout, scaled_layout

    res = run_flower_round(3, scaled_layout(resnet18_layout(), 800_000), timeout=120)
    assert res["ok"], res
    assert res["num_clients"] == 3 and res["update_bytes"] == 800_000
    # the server window starts after the clients' marks (it excludes their serialisation)
    assert res["server_s"] is not None and 0 < res["server_s"] <= res["e2e_s"]
    assert 0 < res["ingest_s"] <= res["e2e_s"] and res["aggregate_s"] > 0
    # The peak is the window's (VmHWM reset as the clients were released): the server held
    # three updates at once, so it exceeds the footprint it had then.
    assert res["server_hwm_bytes"] > res["server_idle_rss_bytes"] > 0


def test_default_payload_is_resnet18s_floating_point_state_dict() -> None:
    from bench.harness.round_clients import RESNET18_VALUES, resnet18_layout

    layout = resnet18_layout()
    assert sum(math.prod(s) for _, s in layout) == RESNET18_VALUES and len(layout) == 102
