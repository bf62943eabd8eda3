"""The gateway's background work (``gateway.background``): a task that fails is logged and
counted, never lost in silence; the set holds only tasks in flight; a journal operation Redis
refuses is tried again (counted) until it lands, and given up only when its work is gone."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.background import Abandoned, Background, JournalRetry
from gateway.journal import NotRoot


def _counters() -> tuple[CollectorRegistry, Counter, Counter]:
    reg = CollectorRegistry()
    failures = Counter("failures", "task failures", ["task"], registry=reg)
    retries = Counter("retries", "journal retries", ["op"], registry=reg)
    return reg, failures, retries


def test_a_failed_task_is_logged_and_counted_and_no_task_is_held_once_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg, failures, _ = _counters()

    async def boom() -> None:
        raise RuntimeError("lost journal write")

    async def abandoned() -> None:
        raise Abandoned("the job went")

    async def fine() -> None:
        await asyncio.sleep(0)

    async def run() -> Background:
        bg = Background(failures)
        for i in range(50):
            bg.spawn(fine(), f"forward:j/{i}")
        bg.spawn(boom(), "publish:j/3")
        bg.spawn(abandoned(), "journal:j/3/1")
        await asyncio.gather(*bg.tasks, return_exceptions=True)
        await asyncio.sleep(0)  # done-callbacks run
        return bg

    with caplog.at_level(logging.ERROR, logger="gateway.background"):
        bg = asyncio.run(run())
    assert bg.tasks == set()
    assert reg.get_sample_value("failures_total", {"task": "publish"}) == 1
    assert reg.get_sample_value("failures_total", {"task": "journal"}) is None
    (rec,) = caplog.records
    assert "publish:j/3 failed" in rec.getMessage() and rec.exc_info is not None


def test_a_refused_journal_operation_is_tried_again_until_it_lands() -> None:
    reg, _, retries = _counters()
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RedisConnectionError("Redis is down")
        return "written"

    retry = JournalRetry(retries, 0.01, threading.Event())
    assert asyncio.run(retry("publish", flaky, lambda: True)) == "written"
    assert len(calls) == 3 and reg.get_sample_value("retries_total", {"op": "publish"}) == 2


def test_a_journal_operation_is_given_up_only_when_its_work_is_gone_and_answers_pass() -> None:
    _, _, retries = _counters()
    stopping = threading.Event()
    retry = JournalRetry(retries, 0.01, stopping)
    alive = [True]
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        if len(calls) == 4:
            alive[0] = False  # the round ended meanwhile
        raise RedisConnectionError("Redis is down")

    with pytest.raises(Abandoned):
        asyncio.run(retry("slot_done", down, lambda: alive[0]))
    assert len(calls) == 4

    async def fenced() -> None:
        raise NotRoot("another node took the job over")

    with pytest.raises(NotRoot):  # an answer, not a failure: no retry
        asyncio.run(retry("publish", fenced, lambda: True))
    stopping.set()
    calls.clear()
    with pytest.raises(Abandoned):
        asyncio.run(retry("publish", down, lambda: True))
    assert calls == []
