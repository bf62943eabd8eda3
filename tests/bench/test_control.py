"""bench.control: whole re-plan figures against the target, the cold start it measures."""

from __future__ import annotations

import pytest

from bench.control import _replan_case, measure_costs
from bench.control_report import verdict, vs_paper


def test_a_figure_above_its_target_is_reported_as_a_miss() -> None:
    assert verdict(0.5, 1.0) == "meets <= 1 ms"
    assert verdict(1.0, 1.0) == "meets <= 1 ms"
    assert verdict(6.1, 1.0) == "MISSES <= 1 ms"
    assert vs_paper(0.1, 0.2) == "2.0x faster than 0.2 ms"
    assert vs_paper(6.0, 0.2) == "30.0x SLOWER than 0.2 ms"


def test_the_replan_case_reports_the_whole_replan_of_all_nodes_not_a_per_node_share() -> None:
    case = _replan_case(100, 100, repeats=3)
    assert case["nodes"] == 100
    assert set(case) == {"nodes", "replan_and_diff", "ewma_estimate"}
    assert case["replan_and_diff"]["repeats"] == 3
    assert case["replan_and_diff"]["median_ms"] > 0


@pytest.mark.integration
def test_the_cold_start_loads_the_aggregator_handler_without_torch() -> None:
    costs, info = measure_costs(quick=True)
    # the default kernel is numpy: the handler's import chain must not pull torch in
    assert info["cold_start_kernel"] == "numpy"
    assert info["cold_start_imports_torch"] is False
    assert info["cold_start_modules"] > 100  # the watchdog and the handler's imports, loaded
    assert costs.cold_s > 0 and costs.cold_cpu_s > 0
