"""One memory budget per node (``cache_engine.node_memory``, ``cache_engine.budget``): the
setting both the node gateway and the cache engine read, the store's bytes as the memory file
system counts them, and the engine's account with the store in it (leases counted once)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_engine.budget import MemoryBudget, OverBudget
from cache_engine.node_memory import (
    DEFAULT_FRACTION,
    NODE_MEMORY_VAR,
    node_budget,
    past_budget,
    store_bytes,
)
from cache_engine.settings import EngineSettings
from core.objstore import Namespace
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
    assert b.overdraft() == 100 and b.room() == 0


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
