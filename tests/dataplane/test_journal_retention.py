"""The journal keeps two rounds of a job, however long it runs (the soak saw Redis grow with
every round): publishing version v forgets round v-1's updates, slots, checkpoints and plans,
and keeps round v's (its ``meta.json`` and the next round's resume read them)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.journal import PREFIX, Journal, NotRoot


def test_publishing_a_version_forgets_the_round_before_the_one_it_ends(redis_url) -> None:  # type: ignore[no-untyped-def]
    async def run() -> list[str]:
        j = Journal(str(redis_url), redis_url.credentials_file("gateway"))
        try:
            await j.create_job("j", {"name": "j", "nodes": ["n1"]})
            rec = {"key": "00", "weight": 1.0, "count": 1}
            for rnd in (1, 2, 3):
                await j.accept("j", rnd, "c1", {"key": "00", "weight": 1.0, "node": "n1"})
                await j.slot_done("j", rnd, 1, rec, node="n1")
                await j.slot_checkpoint("j", rnd, 2, rec, node="n1")
                await j.save_plan("j", rnd, "n1", {"slots": [], "version": 0})
                await j.publish("j", rnd, {"key": "00", "weight": 1.0, "count": 1}, root="n1")
            assert await j.version("j") == 3
            assert await j.round_updates("j", 3) and await j.plan("j", 3, "n1")
            assert not await j.round_updates("j", 2) and await j.plan("j", 2, "n1") is None
            assert not await j.done_slots("j", 1, "n1") and not await j.checkpoints("j", 2, "n1")
            assert await j.done_slots("j", 3, "n1") == {1: rec}
            assert await j.checkpoints("j", 3, "n1") == {2: rec}
            found = [k async for k in j.r.scan_iter(match=f"{PREFIX}job:j:*")]
            return sorted(k.decode() if isinstance(k, bytes) else k for k in found)
        finally:
            await j.close()

    keys = asyncio.run(run())
    prefix = f"{PREFIX}job:j:"
    assert keys == [
        f"{prefix}round:3",
        f"{prefix}round:3:checkpoints",
        f"{prefix}round:3:plans",
        f"{prefix}round:3:slots",
        f"{prefix}state",
    ]


def test_a_node_takes_a_job_over_from_its_root_and_the_old_root_can_publish_no_more(
    redis_url,
) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        j = Journal(str(redis_url), redis_url.credentials_file("gateway"))
        try:
            await j.create_job("t", {"name": "t", "nodes": ["n0", "n1", "n2"]})
            await j.publish("t", 4, {"key": "aa", "weight": 2.0, "count": 2}, root="n0")
            with pytest.raises(NotRoot, match="version 4, not 3"):  # a stale takeover
                await j.take_root("t", "n0", "n1", 3, {"key": "bb", "weight": 0, "count": 0})
            with pytest.raises(NotRoot, match="not the root"):
                await j.take_root("t", "n2", "n1", 4, {"key": "bb", "weight": 0, "count": 0})
            meta = await j.take_root("t", "n0", "n1", 4, {"key": "bb", "weight": 0, "count": 0})
            assert meta["nodes"] == ["n1", "n2", "n0"]  # the old root stays a node, last
            assert (await j.job("t") or {})["nodes"] == ["n1", "n2", "n0"]
            assert await j.global_record("t") == {"key": "bb", "weight": 0, "count": 0}
            with pytest.raises(NotRoot):  # a second takeover from the same dead root loses
                await j.take_root("t", "n0", "n2", 4, {"key": "cc", "weight": 0, "count": 0})
            with pytest.raises(NotRoot):  # the old root, back from a partition, is fenced
                await j.publish("t", 5, {"key": "dd", "weight": 1.0, "count": 1}, root="n0")
            assert await j.version("t") == 4
            await j.publish("t", 5, {"key": "ee", "weight": 1.0, "count": 1}, root="n1")
            assert await j.version("t") == 5
            for c, node in (("c1", "n0"), ("c2", "n1"), ("c3", "n0")):
                await j.accept("t", 6, c, {"key": "00", "weight": 1.0, "node": node})
            assert await j.forget_updates("t", 6, "n0") == ["c1", "c3"]
            assert sorted(await j.round_updates("t", 6)) == ["c2"]
            assert await j.accept("t", 6, "c1", {"key": "01", "weight": 1.0, "node": "n1"})
        finally:
            await j.close()

    asyncio.run(run())
