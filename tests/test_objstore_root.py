"""The store root in /dev/shm is private: per-user default name, squatted or loose roots refused."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.objstore import (
    DEFAULT_ROOT,
    Namespace,
    StoreError,
    UnsafeStoreRoot,
    check_root,
    default_root,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a folder owned by another uid needs root (os.chown)"
)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture()
def root() -> Iterator[Path]:
    """A fresh, not yet existing root in /dev/shm; removed after the test, whoever made it."""
    p = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    yield p
    if p.is_symlink() or p.is_file():
        p.unlink()
    else:
        shutil.rmtree(p, ignore_errors=True)


def squat(p: Path, uid: int, perm: int = 0o777) -> None:
    p.mkdir()
    os.chown(p, uid, uid)
    os.chmod(p, perm)


@needs_root
def test_squatted_root_of_another_uid_mode_0777_is_refused_and_left_untouched(root: Path) -> None:
    squat(root, NOBODY)
    with pytest.raises(UnsafeStoreRoot) as err:
        Namespace(root, "node-a", "job1", 64, pool=1)
    e = err.value
    assert (e.path, e.uid, e.mode) == (root, NOBODY, 0o777)
    # the message names the folder, its owner and mode, what is needed and what to do
    msg = str(e)
    assert str(root) in msg and f"uid {NOBODY}" in msg and "mode 0777" in msg
    assert "another user" in msg and "mode 0700" in msg and "--shm-root" in msg
    assert isinstance(e, StoreError)
    assert list(root.iterdir()) == [] and mode(root) == 0o777 and root.stat().st_uid == NOBODY
    with pytest.raises(UnsafeStoreRoot):
        check_root(root)


@needs_root
def test_root_of_another_uid_is_refused_even_with_mode_0700(root: Path) -> None:
    squat(root, NOBODY, 0o700)
    with pytest.raises(UnsafeStoreRoot, match="belongs to another user"):
        check_root(root)


@pytest.mark.parametrize("perm", [0o777, 0o755, 0o750, 0o701, 0o1777])
def test_own_root_open_to_others_is_refused_not_tightened(root: Path, perm: int) -> None:
    root.mkdir()
    os.chmod(root, perm)  # what was planted inside while it was open would stay: refuse
    with pytest.raises(UnsafeStoreRoot, match="open to other users") as err:
        Namespace(root, "n", "j", 64)
    assert err.value.mode == perm and f"mode {perm:04o}" in str(err.value)
    assert mode(root) == perm and list(root.iterdir()) == []


def test_symlink_root_is_refused_even_to_a_private_folder(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    root.symlink_to(target)
    with pytest.raises(UnsafeStoreRoot, match="symbolic link") as err:
        Namespace(root, "n", "j", 64)
    assert str(target) in str(err.value)
    with pytest.raises(UnsafeStoreRoot):
        check_root(root)
    assert list(target.iterdir()) == []


def test_a_file_as_root_is_refused(root: Path) -> None:
    root.write_bytes(b"")
    os.chmod(root, 0o600)
    with pytest.raises(UnsafeStoreRoot, match="not a directory"):
        Namespace(root, "n", "j", 64)


def test_loose_node_folder_inside_a_private_root_is_refused(root: Path) -> None:
    root.mkdir(mode=0o700)
    (root / "n").mkdir()
    os.chmod(root / "n", 0o777)
    with pytest.raises(UnsafeStoreRoot) as err:
        Namespace(root, "n", "j", 64)
    assert err.value.path == root / "n"


def test_fresh_root_and_its_folders_are_created_0700_whatever_the_umask(root: Path) -> None:
    old = os.umask(0)
    try:
        ns = Namespace(root, "n", "j", 64, pool=1)
    finally:
        os.umask(old)
    try:
        assert [mode(p) for p in (root, root / "n", root / "n" / "j")] == [0o700] * 3
        assert root.stat().st_uid == os.geteuid()
        assert check_root(root) == root
        again = Namespace(root, "n", "j2", 64)  # an existing private root is accepted
        again.close()
    finally:
        ns.close()
    assert not root.exists()


def test_check_root_creates_nothing_for_a_missing_root(root: Path) -> None:
    assert check_root(root) == root
    assert not root.exists()


def test_default_root_is_per_user_and_per_instance_and_stable() -> None:
    a, b = default_root(Path("/srv/a")), default_root(Path("/srv/b"))
    assert a != b and a == default_root(Path("/srv/a"))
    assert a.parent == Path("/dev/shm") and a.name.startswith(f"fedfaas-{os.geteuid()}-")
    assert default_root(Path.cwd()) == DEFAULT_ROOT
    assert Path("/dev/shm/fedfaas") != DEFAULT_ROOT


def test_gateway_settings_default_to_the_per_instance_root() -> None:
    from gateway import GatewaySettings

    assert GatewaySettings.model_fields["shm_root"].default == DEFAULT_ROOT


@needs_root
def test_gateway_with_a_squatted_root_is_refused_at_start(
    root: Path, tmp_path: Path, redis_url: str
) -> None:
    from tests.dataplane.gwutil import GatewayThread, settings

    squat(root, NOBODY)
    g = GatewayThread(settings(tmp_path, redis_url, shm_root=root))
    with pytest.raises(UnsafeStoreRoot, match=str(root)):
        g.start()
    g.stop()
    assert list(root.iterdir()) == [] and root.stat().st_uid == NOBODY
