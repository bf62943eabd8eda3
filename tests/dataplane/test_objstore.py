"""Object store contract: namespaces, the arena and its slots, seal, leases, clean-up, recovery,
and access across processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from core.objstore import (
    Namespace,
    ObjectNotFound,
    ObjectSealed,
    StoreClient,
    StoreError,
    StoreFull,
)
from core.objstore.arena import ARENA_NAME, STANDALONE, key_slot

SIZE = 1 << 16


@pytest.fixture()
def shm_root() -> Iterator[Path]:
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    yield root
    assert not root.exists(), f"store left {list(root.rglob('*'))} behind"


@pytest.fixture()
def ns(shm_root: Path) -> Iterator[Namespace]:
    n = Namespace(shm_root, "node-a", "job1", SIZE, pool=2)
    yield n
    n.close()


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def resident(p: Path) -> int:
    """Bytes of memory a tmpfs file holds."""
    return os.stat(p).st_blocks * 512


def sealed_object(ns: Namespace, value: float) -> str:
    o = ns.allocate()
    o.ndarray(np.float32)[:] = value
    o.close()
    ns.seal(o.key)
    return o.key


def test_namespace_folders_are_private_and_the_arena_is_mode_0600(
    ns: Namespace, shm_root: Path
) -> None:
    assert mode(shm_root) == 0o700 and mode(shm_root / "node-a") == 0o700 and mode(ns.path) == 0o700
    assert mode(ns.path / ARENA_NAME) == 0o600
    obj = ns.allocate()
    assert len(obj.key_bytes) == 16 and obj.nbytes == SIZE
    assert key_slot(obj.key_bytes) < 2  # one of the two pre-faulted slots
    obj.close()


def test_keys_are_random_and_unique(ns: Namespace) -> None:
    objs = [ns.allocate() for _ in range(5)]
    assert len({o.key for o in objs}) == 5
    for o in objs:
        o.close()


def test_a_freed_slot_is_reused_and_its_old_key_is_refused(ns: Namespace) -> None:
    a = ns.allocate()
    a.close()
    ns.seal(a.key)
    slot = key_slot(a.key_bytes)
    ns.release(a.key)
    assert not ns.exists(a.key)
    b = ns.allocate()
    b.close()
    ns.seal(b.key)
    assert key_slot(b.key_bytes) == slot and b.key != a.key
    with pytest.raises(ObjectNotFound):
        ns.open(a.key)  # a stale frame naming the old object reads nothing
    assert ns.stats()["arena_slots"] == 2  # no slot added: the pool served both


def test_seal_makes_object_read_only_for_every_later_mapping(ns: Namespace) -> None:
    key = sealed_object(ns, 3.0)
    with pytest.raises(ObjectSealed):
        ns.open_writable(key)
    r = ns.open(key)
    arr = r.ndarray(np.float32)
    assert not arr.flags.writeable
    with pytest.raises(TypeError):
        r.buf[0] = 1
    assert float(arr.sum()) == 3.0 * SIZE / 4
    del arr
    r.close()


def test_an_unsealed_object_is_not_read_in_place(ns: Namespace) -> None:
    w = ns.allocate()
    w.close()
    with pytest.raises(StoreError, match="not sealed"):
        ns.open(w.key)


def test_leases_free_only_after_the_last_consumer_releases(ns: Namespace) -> None:
    obj = ns.allocate()
    obj.close()
    ns.retain(obj.key, 2)
    assert ns.leases(obj.key) == 3
    assert not ns.release(obj.key)
    assert not ns.release(obj.key)
    assert ns.exists(obj.key)
    assert ns.release(obj.key)
    assert not ns.exists(obj.key)
    with pytest.raises(ObjectNotFound):
        ns.release(obj.key)


def test_max_objects_caps_live_objects(shm_root: Path) -> None:
    ns = Namespace(shm_root, "n", "j", SIZE, max_objects=1)
    try:
        a = ns.allocate()
        with pytest.raises(StoreFull):
            ns.allocate()
        a.close()
        ns.free(a.key)
        ns.allocate().close()
    finally:
        ns.close()


def test_freed_slots_past_the_pool_give_their_memory_back(shm_root: Path) -> None:
    ns = Namespace(shm_root, "n", "j", SIZE, pool=1, pool_max=1)
    try:
        arena = ns.path / ARENA_NAME
        keys = [ns.allocate() for _ in range(4)]
        for o in keys:
            o.close()
        assert resident(arena) >= 4 * SIZE
        for o in keys:
            ns.release(o.key)
        assert ns.stats()["pooled"] == 1
        assert resident(arena) < 2 * SIZE  # the pool's one slot (and the table) only
        ns.trim_pool(0)
        assert resident(arena) < SIZE
    finally:
        ns.close()


def test_a_full_arena_overflows_into_plain_files_with_the_same_contract(shm_root: Path) -> None:
    ns = Namespace(shm_root, "n", "j", SIZE, arena_slots=1)
    try:
        a, b = ns.allocate(), ns.allocate()
        assert key_slot(a.key_bytes) == 0 and key_slot(b.key_bytes) == STANDALONE
        b.ndarray(np.float32)[:] = 5.0
        b.close()
        path = ns.path / b.key
        assert mode(path) == 0o600
        ns.seal(b.key)
        assert mode(path) == 0o400 and ns.sealed(b.key)
        with pytest.raises(ObjectSealed):
            ns.open_writable(b.key)
        with StoreClient(ns.path).open(b.key) as r:
            assert float(r.ndarray(np.float32)[0]) == 5.0
        ns.release(b.key)
        assert not path.exists()
        a.close()
    finally:
        ns.close()


def test_malformed_keys_and_names_are_refused(ns: Namespace, shm_root: Path) -> None:
    for bad in ("../etc/passwd", "ABCDEF" * 6, "00" * 15, b"short"):
        with pytest.raises(StoreError):
            ns.open(bad)
    with pytest.raises(ObjectNotFound):
        ns.open("ff" * 2 + "00" * 14)  # a slot past the arena's end
    with pytest.raises(StoreError):
        Namespace(shm_root, "../x", "j", SIZE)


def test_close_leaves_the_root_as_it_found_it(shm_root: Path) -> None:
    a = Namespace(shm_root, "n1", "ja", SIZE, pool=1)
    b = Namespace(shm_root, "n1", "jb", SIZE, pool=1)
    a.allocate().close()
    kb = sealed_object(b, 1.0)
    a.close()
    assert b.path.exists() and b.exists(kb)
    b.close()
    assert not shm_root.exists()


def test_close_gives_the_memory_back_even_while_an_endpoint_maps_the_arena(
    ns: Namespace,
) -> None:
    sealed_object(ns, 1.0)
    reader = StoreClient(ns.path)  # an endpoint granted the job: maps the whole arena
    fd = os.open(ns.path / ARENA_NAME, os.O_RDONLY)
    try:
        assert os.fstat(fd).st_blocks > 0
        ns.close()
        assert os.fstat(fd).st_blocks == 0  # unlinked and every page given back
    finally:
        os.close(fd)
        reader.close()


def test_a_new_owner_adopts_sealed_objects_and_sweeps_the_rest(shm_root: Path) -> None:
    first = Namespace(shm_root, "n", "j", SIZE, pool=1)
    kept = sealed_object(first, 7.0)
    dropped = sealed_object(first, 8.0)
    half = first.allocate()  # never sealed: may be half-written
    half.close()
    first.detach()  # as a SIGKILLed gateway leaves it
    second = Namespace(shm_root, "n", "j", SIZE, pool=1)
    try:
        assert not second.adopt(half.key)
        assert second.adopt(kept) and second.adopt(kept)
        with second.open(kept) as r:
            assert float(r.ndarray(np.float32)[0]) == 7.0
        assert second.sweep() == 2
        assert not second.exists(dropped) and not second.exists(half.key)
        assert not second.adopt(dropped)
        slots = second.stats()["arena_slots"]
        for _ in range(3):  # the pool's slot and the two swept ones serve new objects
            second.allocate().close()
        assert second.stats()["arena_slots"] == slots
    finally:
        second.close()


def test_an_arena_of_other_sizes_is_replaced_not_adopted(shm_root: Path) -> None:
    first = Namespace(shm_root, "n", "j", SIZE)
    key = sealed_object(first, 1.0)
    first.detach()
    second = Namespace(shm_root, "n", "j", 2 * SIZE)
    try:
        assert not second.adopt(key)
        assert second.allocate().nbytes == 2 * SIZE
    finally:
        second.close()


READER = textwrap.dedent("""
    import sys, numpy as np
    from core.objstore import StoreClient, ObjectSealed
    c = StoreClient(sys.argv[1])
    r = c.open(sys.argv[2])
    a = r.ndarray(np.float32)
    assert not a.flags.writeable
    t = r.tensor()
    print(float(a.sum()), float(t[1]))
    try:
        c.open_writable(sys.argv[2]); print("writable")
    except ObjectSealed:
        print("sealed")
    w = c.open_writable(sys.argv[3])
    w.ndarray(np.float32)[:] = 2.0
    w.close()
    c.seal(sys.argv[3])
    print(c.arena_remaps)
    sys.stdin.readline()  # the owner grows the arena meanwhile
    with c.open(sys.stdin.readline().strip()) as late:
        print(float(late.ndarray(np.float32)[0]), c.arena_remaps)
""")


@pytest.mark.integration
def test_another_process_reads_in_place_and_writes_only_unsealed_objects(ns: Namespace) -> None:
    src = ns.allocate()
    src.ndarray(np.float32)[:] = np.arange(SIZE // 4, dtype=np.float32)
    src.close()
    ns.seal(src.key)
    acc = ns.allocate()
    acc.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(ns.path), src.key, acc.key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    total, second = proc.stdout.readline().split()
    assert float(total) == float(np.arange(SIZE // 4, dtype=np.float64).sum())
    assert float(second) == 1.0 and proc.stdout.readline().strip() == "sealed"
    assert proc.stdout.readline().strip() == "1"  # one mapping for every object so far
    assert ns.sealed(acc.key)
    with ns.open(acc.key) as r:
        assert float(r.ndarray(np.float32)[-1]) == 2.0
    grown = [ns.allocate() for _ in range(3)]  # past the two pre-faulted slots: the file grows
    for g in grown:
        g.ndarray(np.float32)[:] = 9.0
        g.close()
        ns.seal(g.key)
    proc.stdin.write(f"\n{grown[-1].key}\n")
    proc.stdin.flush()
    value, remaps = proc.stdout.readline().split()
    assert float(value) == 9.0 and remaps == "2"  # mapped again once, for the new slots
    assert proc.wait(timeout=60) == 0


@pytest.mark.integration
def test_store_outlives_a_killed_reader_and_no_tracker_unlinks_objects(ns: Namespace) -> None:
    key = sealed_object(ns, 1.0)
    code = f"from core.objstore import StoreClient; r = StoreClient({str(ns.path)!r}).open({key!r}); import os; os._exit(9)"
    proc = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 9
    assert ns.exists(key) and StoreClient(ns.path).exists(key)


def test_a_key_past_the_end_of_an_arena_that_did_not_grow_costs_no_mapping(
    ns: Namespace,
) -> None:
    key = sealed_object(ns, 1.0)
    reader = StoreClient(ns.path)
    try:
        for _ in range(3):
            with pytest.raises(ObjectNotFound):
                reader.open("ff" + "00" * 15)  # slot 255 of a two-slot arena
        with reader.open(key) as r:
            assert float(r.ndarray(np.float32)[0]) == 1.0
        assert reader.arena_remaps == 1
    finally:
        reader.close()


def test_a_slot_is_mapped_for_writing_once_and_a_replicas_clients_share_the_mappings(
    ns: Namespace,
) -> None:
    """The endpoints of one aggregator replica (clients made ``shared``) map the job's arena
    once between them, and each slot read-write once, however many of the pool's objects
    they write there in turn; a client not shared maps its own."""
    a = StoreClient(ns.path, shared=True)
    b = StoreClient(ns.path, shared=True)
    alone = StoreClient(ns.path)
    try:
        first = ns.allocate()
        first.close()
        w = a.open_writable(first.key)
        w.ndarray(np.float32)[:] = 3.0
        w.close()
        a.seal(first.key)
        ns.release(first.key)  # freed: the slot goes back to the pool, mapped
        second = ns.allocate()
        second.close()
        assert key_slot(second.key_bytes) == key_slot(first.key_bytes)  # the slot reused
        w = b.open_writable(second.key)  # the other endpoint, the same slot: no new mapping
        w.ndarray(np.float32)[:] = 4.0
        w.close()
        b.seal(second.key)
        assert a.arena_writable_maps == b.arena_writable_maps == 1
        assert a.arena_remaps == b.arena_remaps == 1  # one read-only mapping between them
        with ns.open(second.key) as r:
            assert float(r.ndarray(np.float32)[-1]) == 4.0
        with pytest.raises(ObjectSealed):  # the kept mapping writes no sealed object
            b.open_writable(second.key)
        ns.release(second.key)
        third = ns.allocate()
        third.close()
        w = alone.open_writable(third.key)
        w.ndarray(np.float32)[:] = 5.0
        w.close()
        assert alone.arena_writable_maps == 1 and a.arena_writable_maps == 1
        a.close()  # b still reads through the shared mappings
        alone.seal(third.key)
        with b.open(third.key) as r:
            assert float(r.ndarray(np.float32)[0]) == 5.0
    finally:
        for c in (a, b, alone):
            c.close()
