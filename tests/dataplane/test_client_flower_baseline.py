"""The Flower peer of the round benchmark (bench.flower_baseline), on a small payload."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("flwr", reason="flwr (the benchmark's peer) is not installed")


@pytest.mark.integration
def test_a_real_flower_round_reports_its_window_and_server_memory() -> None:
    from bench.flower_baseline import run_flower_round

    res = run_flower_round(num_clients=3, num_params=200_000, timeout=120)
    assert res["num_clients"] == 3 and res["update_bytes"] == 800_000
    assert 0 < res["ingest_s"] <= res["first_byte_to_model_s"] <= res["round_s"]
    assert res["aggregate_s"] > 0
    # The server held three updates at once, so its peak exceeds its idle footprint.
    assert res["server_peak_rss_bytes"] > res["server_rss_before_round_bytes"]
    assert res["server_peak_rss_sampled_bytes"] <= res["server_peak_rss_bytes"]


def test_default_payload_has_resnet18_parameter_shapes() -> None:
    from bench.flower_baseline import RESNET18_10_CLASSES, resnet18_shapes

    shapes = resnet18_shapes()
    total = sum(math.prod(s) for s in shapes)
    assert total == RESNET18_10_CLASSES and len(shapes) == 62
