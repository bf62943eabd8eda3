"""One memory budget per node (``cache_engine.node_memory``, ``cache_engine.budget``): the
setting both the node gateway and the cache engine read, the store's bytes as the memory file
system counts them, and the engine's account with the store in it (leases counted once)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_engine.budget import SLACK, MemoryBudget, OverBudget
from cache_engine.node_memory import (
    DEFAULT_FRACTION,
    NODE_MEMORY_VAR,
    node_budget,
    past_budget,
    store_bytes,
)
from cache_engine.settings import EngineSettings
from core.objstore import Namespace
from functions.flstore.memory import PrivateMemory
from gateway.settings import GatewaySettings
from tests.platform.conftest import part_context

MIB = 1 << 20


@pytest.fixture()
def root() -> Iterator[Path]:
    """A store root of the test's own on the memory file system."""
    path = Path("/dev/shm") / f"fedfaas-budget-{os.urandom(4).hex()}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_budget_is_the_setting_or_a_fraction_of_the_nodes_memory() -> None:
    assert DEFAULT_FRACTION == 0.5
    assert node_budget(3 * MIB) == 3 * MIB
    assert node_budget(None, memory=8 << 30) == 4 << 30
    assert node_budget(None) > 0  # this machine's memory (or its cgroup limit), halved


def test_the_store_counts_the_pages_its_objects_hold_on_every_node_under_the_root(
    root: Path,
) -> None:
    assert store_bytes(root) == 0 and store_bytes(None) == 0  # none yet: nothing held
    ns = Namespace(root, "node0", "j", MIB, pool=2, pool_max=2)
    try:
        prefaulted = store_bytes(root)
        assert prefaulted >= 2 * MIB  # the pre-faulted buffers hold memory before any object
        a, b = ns.allocate(), ns.allocate()
        assert store_bytes(root) == prefaulted  # they landed in the pre-faulted buffers
        c = ns.allocate()  # a new buffer: one object's pages more
        assert store_bytes(root) - prefaulted >= MIB
        other = Namespace(root, "node1", "j", MIB, pool=1)  # a second gateway, same machine
        try:
            assert store_bytes(root) - prefaulted >= 2 * MIB
        finally:
            other.close()
        for o in (a, b, c):
            o.close()
            ns.free(o.key)
        assert store_bytes(root) <= prefaulted  # past the pool, a freed buffer's pages go back
    finally:
        ns.close()
    assert store_bytes(root) == 0


def test_past_budget_says_what_the_stores_hold_and_what_would_pass_it(root: Path) -> None:
    ns = Namespace(root, "node0", "j", MIB, pool=4)
    try:
        held = store_bytes(root)
        assert past_budget(root, held + MIB, MIB) is None
        why = past_budget(root, held + MIB - 1, MIB)
        assert why is not None and f"hold {held} bytes, and {MIB} more" in why
        assert f"memory budget ({held + MIB - 1} bytes; node_memory_bytes)" in why
        half = past_budget(root, 2 * held, 1, share=0.5)
        assert half is not None and "0.5 of its memory budget" in half
    finally:
        ns.close()


def test_the_engines_account_holds_the_store_and_counts_a_lease_once() -> None:
    store = {"bytes": 300}
    b = MemoryBudget(1000, keep=100, store=lambda: store["bytes"])
    b.report("f0", 200)
    b.lease([("offer:t:c1", 150)])  # pages of the store: its bytes count them already
    assert b.used() == 500 and b.room() == 400
    d = b.describe()
    assert d["store_bytes"] == 300 and d["store_counted"] is True and d["leased_bytes"] == 150
    assert d["used_bytes"] == d["store_bytes"] + d["functions_bytes"] + d["reserved_bytes"]
    store["bytes"] = 600  # the round's uploads arrive: FLStore's room shrinks with them
    with pytest.raises(OverBudget, match="the store's 600 among them"):
        b.reserve(150)  # 800 + 150 > 900
    assert b.overdraft() == 0
    store["bytes"] = 800  # the store grew into FLStore's share: 1000 used, 900 for loads
    assert b.overdraft() == 1000 - (900 + int(SLACK * 100)) and b.room() == 0


def test_a_querys_working_memory_within_the_kept_share_is_no_overdraft() -> None:
    """Issue 36's thrash at 120 updates: loads filled the loads' share, a query's working
    memory (what ``keep`` is for) then counted as FLStore holding too much, and every ping
    round evicted what the next query read again."""
    b = MemoryBudget(1000, keep=300)
    b.report("f0", 650, 650)  # at rest: the loads' share (700) nearly full
    assert b.overdraft() == 0 and b.room() == 50
    b.reserve(50)  # a load: reserved, then its bytes arrive in the function's memory
    b.report("f0", 700, 700)
    assert b.room() == 0 and b.overdraft() == 0  # not counted twice
    b.report("f0", 650, 650)  # (the load given back: the test goes on from before it)
    b.unreserve(50)
    b.report("f0", 900, 650)  # a query runs on it: 250 of working memory, within keep
    assert b.overdraft() == 0
    assert b.room() == 0  # loads wait for the working memory to go
    with pytest.raises(OverBudget, match="900 of 1000 bytes used, 650 of them at rest"):
        b.reserve(30)
    b.report("f0", 1040, 650)  # past the whole budget: given back
    assert b.overdraft() == 40 and b.room() == 0
    b.report("f0", 720, 720)  # at rest past the loads' share (700) by a load's overhead:
    assert b.overdraft() == 0 and b.room() == 0  # no more loads, nothing evicted ...
    assert b.working_room() == 280  # ... and the queries' memory shrinks to the budget
    b.report("f0", 800, 800)  # past it by more than the slack (the store grew, or loads)
    assert b.overdraft() == 800 - (700 + int(SLACK * 300))
    assert b.describe()["functions_resting_bytes"] == 800
    b.report("f1", 100)  # a function that does not say: all of it is resting
    assert b.describe()["functions_resting_bytes"] == 900
    b.forget_function("f1")
    assert b.describe()["functions_resting_bytes"] == 800


def test_a_functions_resting_memory_is_its_idle_memory_moved_by_what_it_loaded() -> None:
    mem = {"private": 100, "held": 0}
    pm = PrivateMemory(lambda: mem["private"], lambda: mem["held"])
    assert pm.status() == {"private_bytes": 100, "resting_bytes": 100, "requests_under_way": 0}
    with pm.serving():  # a load of 40, and a query's 500 of working memory
        mem.update(private=640, held=40)
        assert pm.status() == {
            "private_bytes": 640,
            "resting_bytes": 140,
            "requests_under_way": 1,
        }
        with pm.serving():  # an eviction of 30 meanwhile
            mem.update(private=610, held=10)
            assert pm.status()["resting_bytes"] == 110
    mem.update(private=112)  # done: read again as it is
    assert pm.status() == {"private_bytes": 112, "resting_bytes": 112, "requests_under_way": 0}
    busy = PrivateMemory(lambda: 300, lambda: 0)
    with busy.serving():  # never seen at rest: all of it counts
        assert busy.status()["resting_bytes"] == 300


def test_without_a_store_to_read_the_leases_count_the_pages_flstore_keeps() -> None:
    b = MemoryBudget(1000)
    b.report("f0", 200)
    b.lease([("offer:t:c1", 150), ("mapped:j/1/update/c1", 150)])
    d = b.describe()
    assert b.used() == 500 and d["store_counted"] is False and d["store_bytes"] == 0


def test_one_setting_read_by_the_gateway_and_the_engine_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert NODE_MEMORY_VAR == "FEDFAAS_NODE_MEMORY_BYTES"
    assert (
        EngineSettings().node_memory_bytes is None and GatewaySettings().node_memory_bytes is None
    )
    monkeypatch.setenv(NODE_MEMORY_VAR, str(5 << 30))
    eng, gw = EngineSettings(), GatewaySettings()
    assert eng.node_memory_bytes == gw.node_memory_bytes == 5 << 30
    # a launcher (``fedfaas up``) renders it on each command line, where it wins
    argv = eng.to_argv()
    assert argv[argv.index("--node-memory-bytes") + 1] == str(5 << 30)
    parsed, _ = EngineSettings.from_argv(["--node-memory-bytes", str(3 << 30)])
    assert parsed.node_memory_bytes == 3 << 30
    parsed_gw, _ = GatewaySettings.from_argv(["--node-memory-bytes", str(3 << 30)])
    assert parsed_gw.node_memory_bytes == 3 << 30
    monkeypatch.setenv("FEDFAAS_ENGINE_NODE_MEMORY_BYTES", str(1 << 30))  # the engine alone
    assert EngineSettings().node_memory_bytes == 1 << 30
    assert GatewaySettings().node_memory_bytes == 5 << 30
    monkeypatch.delenv(NODE_MEMORY_VAR)
    monkeypatch.delenv("FEDFAAS_ENGINE_NODE_MEMORY_BYTES")
    assert "--node-memory-bytes" not in EngineSettings().to_argv()  # unset: the default


def test_fedfaas_up_gives_the_engine_the_gateways_store_and_both_the_one_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedfaas.platform import optional
    from fedfaas.platform.nodes import shm_root

    ctx = part_context(tmp_path)
    monkeypatch.setenv(NODE_MEMORY_VAR, str(6 << 30))
    eng, _ = EngineSettings.from_argv(optional.CACHE_ENGINE.argv(ctx)[3:])
    gw0, _ = GatewaySettings.from_argv(optional.GATEWAY.argv(ctx)[3:])
    gw1, _ = GatewaySettings.from_argv(optional.GATEWAY_NODE1.argv(ctx)[3:])
    assert eng.store_root == gw0.shm_root == gw1.shm_root == shm_root(ctx)
    assert eng.node_memory_bytes == gw0.node_memory_bytes == gw1.node_memory_bytes == 6 << 30


def test_a_query_is_given_no_working_memory_a_function_reported_while_busy() -> None:
    """The slow big-rounds test's 2.504 GB against 2.5: a load's answer (read while the load
    was under way) says resting = the last idle reading + the bytes loaded, which misses what
    the loads cost beyond them; a query planned on it right after the round's loads was
    given that much more working memory than the budget had left."""
    b = MemoryBudget(2500, keep=1000)
    b.report("f0", 980, 680, requests_under_way=1)  # a load's answer: resting estimated
    b.report("f1", 440, 440)  # a ping with nothing under way
    assert b.unsettled() == ["f0"]
    assert b.working_room() == 2500 - 980 - 440  # f0 with all of its private memory
    assert b.overdraft() == 0  # giving memory back still goes by the resting figure
    b.report("f0", 985, 985, requests_under_way=0)  # the engine asks again: at rest
    assert b.unsettled() == [] and b.working_room() == 2500 - 985 - 440
    b.report("f1", 900, 440, requests_under_way=1)  # a query under way on f1: its working
    assert b.working_room() == 2500 - 985 - 900  # memory is not given to another query
    b.forget_function("f1")
    assert b.unsettled() == [] and b.describe()["functions_busy"] == 0


def test_the_planner_asks_a_function_that_reported_while_busy_again_before_it_plans() -> None:
    """cache_engine.parts: a query's working memory is planned on fresh reports (a ping of
    each live function whose last report was read busy), not on a load's estimate."""
    import threading
    from types import SimpleNamespace

    from cache_engine.parts import PartPlanner

    budget = MemoryBudget(2500, keep=1000)
    budget.report("f0", 980, 680, requests_under_way=1)  # the round's last load answered
    budget.report("gone", 300, 100, requests_under_way=1)
    pinged: list[str] = []

    def ping(name: str) -> None:
        pinged.append(name)
        budget.report(name, 985, 985, requests_under_way=0)  # at rest now

    engine = SimpleNamespace(
        _lock=threading.RLock(),
        budget=budget,
        functions={"f0": SimpleNamespace(alive=True), "gone": SimpleNamespace(alive=False)},
        _ping=ping,
    )
    planner = PartPlanner(engine)  # type: ignore[arg-type]
    try:
        assert planner.working_room() == 2500 - 985 - 300
        assert pinged == ["f0"]  # a dead function is not asked (it counts as it said)
        assert planner.working_room() == 2500 - 985 - 300 and pinged == ["f0"]  # settled
    finally:
        planner.close()
