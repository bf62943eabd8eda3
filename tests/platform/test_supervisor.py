"""The supervisor's restart rule (CrashLoopBackOff): a part that dies once starts again at once;
one that keeps dying waits twice as long each time, up to a cap; one that ran long enough is
new again. Pure logic; the supervisor on a real platform is in ``test_one_platform.py``."""

from __future__ import annotations

from fedfaas.platform.supervisor import Backoff


def test_a_first_death_restarts_at_once_and_a_crash_loop_backs_off_to_the_cap() -> None:
    b = Backoff(backoff_s=1.0, max_backoff_s=8.0, stable_s=60.0)
    assert b.ready("gateway", 0.0)
    b.note_start("gateway", 0.0)
    waits = []
    now = 0.0
    for _ in range(6):  # it dies at once after each start
        wait = 0.0
        while not b.ready("gateway", now + wait):
            wait += 0.25
        waits.append(wait)
        now += wait
        b.note_start("gateway", now)
    assert waits == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_part_that_ran_for_stable_s_restarts_at_once_again() -> None:
    b = Backoff(backoff_s=1.0, max_backoff_s=30.0, stable_s=60.0)
    for t in (0.0, 0.0, 1.0, 3.0):
        b.note_start("redis", t)
    assert not b.ready("redis", 4.0)
    assert b.ready("redis", 63.0), "it ran for a minute: a fresh crash"
    b.note_start("redis", 63.0)
    assert b.delay.get("redis", 0.0) == 0.0
    assert b.ready("control-plane", 63.0), "each part has its own delay"
