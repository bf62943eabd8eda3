"""The journal keeps two rounds of a job, however long it runs (the soak saw Redis grow with
every round): publishing version v forgets round v-1's updates, slots, checkpoints and plans,
and keeps round v's (its ``meta.json`` and the next round's resume read them)."""

from __future__ import annotations

import asyncio

from gateway.journal import PREFIX, Journal


def test_publishing_a_version_forgets_the_round_before_the_one_it_ends(redis_url) -> None:  # type: ignore[no-untyped-def]
    async def run() -> list[str]:
        j = Journal(str(redis_url), redis_url.credentials_file("gateway"))
        try:
            for rnd in (1, 2, 3):
                await j.accept("j", rnd, "c1", {"key": "00", "weight": 1.0, "node": "n1"})
                await j.slot_done("j", rnd, 1, {"key": "00", "weight": 1.0, "count": 1})
                await j.slot_checkpoint("j", rnd, 2, {"key": "00", "weight": 1.0, "count": 1})
                await j.save_plan("j", rnd, "n1", {"slots": [], "version": 0})
                await j.publish("j", rnd, {"key": "00", "weight": 1.0, "count": 1})
            assert await j.version("j") == 3
            assert await j.round_updates("j", 3) and await j.plan("j", 3, "n1")
            assert not await j.round_updates("j", 2) and await j.plan("j", 2, "n1") is None
            assert not await j.done_slots("j", 1) and not await j.checkpoints("j", 2)
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
