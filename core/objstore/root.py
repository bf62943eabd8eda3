"""Where the store lives in /dev/shm, and the one check that a store folder is private.

``/dev/shm`` is writable by every local user, and the root holds every job's model updates: a
folder another user made there first (a squatted root), or one they can enter, would let them
read the updates or swap what the aggregators read. So the root gets a per-user, per-instance
name by default, and :func:`private_dir` is the one place that creates or accepts a store
folder: a directory, not a symbolic link, owned by this process's user, mode 0700. It refuses
anything else with :class:`~core.objstore.errors.UnsafeStoreRoot` rather than fix it up
(whatever was planted inside a loose folder would stay). Every opener goes through it: the
:class:`~core.objstore.store.Namespace` for the root, node and job folders, and the gateway
with :func:`check_root` at start. Aggregator replicas never open the root by name: they get a
directory fd from the node's router.

Out of scope: a root whose parent another user can rename entries in (``/dev/shm`` and
``/tmp`` are sticky, so nobody else can move our folder away there).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from core.objstore.errors import UnsafeStoreRoot

SHM = Path("/dev/shm")


def default_root(cwd: Path | None = None) -> Path:
    """``/dev/shm/fedfaas-<uid>-<tag>``, the root when none is given.

    ``tag`` hashes the working directory (where a gateway's default ``state_dir`` lives), so
    neither two users nor two checkouts share a root by default, and a gateway restarted in
    the same place finds its objects again. ``fedfaas up`` and the tests pass their own root.
    """
    try:
        where = str(cwd or Path.cwd())
    except OSError:  # the working directory was removed
        where = ""
    tag = hashlib.sha256(where.encode()).hexdigest()[:8]
    return SHM / f"fedfaas-{os.geteuid()}-{tag}"


#: the default root of a process started here (computed once, at import)
DEFAULT_ROOT = default_root()


def _check(path: Path, st: os.stat_result) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStoreRoot(path, f"is a symbolic link (to {os.readlink(path)})", st.st_uid)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStoreRoot(path, "is not a directory", st.st_uid, mode)
    if st.st_uid != os.geteuid():
        raise UnsafeStoreRoot(path, "belongs to another user", st.st_uid, mode)
    if mode & 0o077:
        raise UnsafeStoreRoot(path, "is open to other users", st.st_uid, mode)


def check_root(root: str | Path) -> Path:
    """Refuse an existing ``root`` that is not private; create nothing (a gateway at start).

    Raises
    ------
    UnsafeStoreRoot
        If ``root`` exists and is a symbolic link, not a directory, another user's, or has
        any group or other permission bit.
    """
    root = Path(root)
    with contextlib.suppress(FileNotFoundError):
        _check(root, os.lstat(root))
    return root


def private_dir(path: str | Path) -> Path:
    """Create ``path`` with mode 0700, or accept it if it exists and is private.

    Raises
    ------
    UnsafeStoreRoot
        As :func:`check_root`, for a folder that already exists.
    """
    path = Path(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # mkdir's mode went through the umask
    _check(path, os.lstat(path))
    return path
