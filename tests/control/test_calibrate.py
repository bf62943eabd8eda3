"""MC calibration (appendix E): the knee finder and the step procedure (pure logic)."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.calibrate import find_knee, measure
from control_plane.errors import InvalidInput


def test_knee_is_the_first_level_where_exec_time_grows_past_the_threshold():
    levels = [1, 2, 4, 8, 16]
    rates = [10.0, 20.0, 40.0, 60.0, 64.0]
    execs = [0.10, 0.10, 0.11, 0.16, 0.25]
    cal = find_knee(levels, rates, execs, threshold=1.5)
    assert cal.knee_level == 8
    assert cal.mc == pytest.approx(60.0 * 0.16)


def test_without_a_knee_mc_is_the_last_level_lower_bound():
    cal = find_knee([1, 2], [5.0, 10.0], [0.2, 0.21])
    assert cal.knee_level is None and cal.mc == pytest.approx(10.0 * 0.21)


@pytest.mark.parametrize(
    "args",
    [
        ([], [], []),
        ([1, 2], [1.0], [1.0, 1.0]),
        ([2, 1], [1.0, 1.0], [1.0, 1.0]),
        ([1], [0.0], [1.0]),
    ],
)
def test_bad_measurements_are_rejected(args):
    with pytest.raises(InvalidInput):
        find_knee(*args)


def test_step_procedure_finds_the_capacity_of_a_node_with_c_parallel_slots():
    """A node that aggregates up to C updates at once, each taking s seconds (synthetic)."""
    cap, s = 6, 0.001
    calls = []

    async def send_batch(n: int) -> list[float]:
        calls.append(n)
        waves = -(-n // cap)
        await asyncio.sleep(waves * s)
        # update i finishes with its wave; E = mean completion time
        return [((i // cap) + 1) * s for i in range(n)]

    cal = asyncio.run(measure(send_batch, (1, 2, 4, 8, 16, 32), threshold=1.2, repeats=1))
    assert cal.knee_level == 8  # first level beyond the 6 parallel slots
    assert calls == [1, 2, 4, 8]  # stops at the knee
    assert cal.mc > 0 and cal.exec_times[-1] == pytest.approx(1.25 * s)
