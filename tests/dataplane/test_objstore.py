"""Object store contract: namespaces, pool, seal, leases, clean-up, and access across processes."""

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

from fedfaas.objstore import (
    Namespace,
    ObjectNotFound,
    ObjectSealed,
    StoreClient,
    StoreError,
    StoreFull,
)

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


def test_namespace_folders_are_private_and_objects_mode_0600(ns: Namespace, shm_root: Path) -> None:
    assert mode(shm_root) == 0o700 and mode(shm_root / "node-a") == 0o700 and mode(ns.path) == 0o700
    obj = ns.allocate()
    assert mode(obj.path) == 0o600
    assert len(obj.key_bytes) == 16 and obj.path.name == obj.key
    assert obj.nbytes == SIZE
    obj.close()


def test_keys_are_random_and_unique(ns: Namespace) -> None:
    objs = [ns.allocate() for _ in range(5)]
    assert len({o.key for o in objs}) == 5
    for o in objs:
        o.close()


def test_allocation_reuses_pooled_buffers_by_rename(ns: Namespace) -> None:
    pooled = {p.stat().st_ino for p in ns.path.glob(".pool-*")}
    assert len(pooled) == 2
    a = ns.allocate()
    assert a.path.stat().st_ino in pooled
    a.close()
    ns.release(a.key)  # back to the pool, same inode
    assert {p.stat().st_ino for p in ns.path.glob(".pool-*")} == pooled
    assert not a.path.exists()


def test_seal_makes_object_read_only_for_every_later_mapping(ns: Namespace) -> None:
    w = ns.allocate()
    w.ndarray(np.float32)[:] = 3.0
    w.close()
    ns.seal(w.key)
    assert mode(w.path) == 0o400
    with pytest.raises(ObjectSealed):
        ns.open_writable(w.key)
    r = ns.open(w.key)
    arr = r.ndarray(np.float32)
    assert not arr.flags.writeable
    with pytest.raises((TypeError, ValueError)):
        r.buf[0] = 1
    assert float(arr.sum()) == 3.0 * SIZE / 4
    del arr
    r.close()


def test_leases_free_only_after_the_last_consumer_releases(ns: Namespace) -> None:
    obj = ns.allocate()
    obj.close()
    ns.retain(obj.key, 2)
    assert ns.leases(obj.key) == 3
    assert not ns.release(obj.key)
    assert not ns.release(obj.key)
    assert obj.path.exists()
    assert ns.release(obj.key)
    assert not obj.path.exists()
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


def test_malformed_keys_and_names_are_refused(ns: Namespace, shm_root: Path) -> None:
    for bad in ("../etc/passwd", "ABCDEF" * 6, "00" * 15, b"short"):
        with pytest.raises(StoreError):
            ns.open(bad)
    with pytest.raises(StoreError):
        Namespace(shm_root, "../x", "j", SIZE)


def test_close_leaves_the_root_as_it_found_it(shm_root: Path) -> None:
    a = Namespace(shm_root, "n1", "ja", SIZE, pool=1)
    b = Namespace(shm_root, "n1", "jb", SIZE, pool=1)
    a.allocate().close()
    ns_b_obj = b.allocate()
    ns_b_obj.close()
    a.close()
    assert b.path.exists() and ns_b_obj.path.exists()
    b.close()
    assert not shm_root.exists()


READER = textwrap.dedent("""
    import sys, numpy as np
    from fedfaas.objstore import StoreClient, ObjectSealed
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
""")


@pytest.mark.integration
def test_another_process_reads_in_place_and_writes_only_unsealed_objects(ns: Namespace) -> None:
    src = ns.allocate()
    src.ndarray(np.float32)[:] = np.arange(SIZE // 4, dtype=np.float32)
    src.close()
    ns.seal(src.key)
    acc = ns.allocate()
    acc.close()
    out = subprocess.run(
        [sys.executable, "-c", READER, str(ns.path), src.key, acc.key],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    total, second, writable = out.stdout.split()
    assert float(total) == float(np.arange(SIZE // 4, dtype=np.float64).sum())
    assert float(second) == 1.0 and writable == "sealed"
    assert ns.sealed(acc.key)
    with ns.open(acc.key) as r:
        assert float(r.ndarray(np.float32)[-1]) == 2.0


@pytest.mark.integration
def test_store_outlives_a_killed_reader_and_no_tracker_unlinks_objects(ns: Namespace) -> None:
    obj = ns.allocate()
    obj.close()
    ns.seal(obj.key)
    code = f"from fedfaas.objstore import StoreClient; r = StoreClient({str(ns.path)!r}).open({obj.key!r}); import os; os._exit(9)"
    proc = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 9
    assert obj.path.exists() and StoreClient(ns.path).exists(obj.key)
