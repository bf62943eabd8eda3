"""Shared-memory object store: plain files under /dev/shm plus mmap.

Layout: ``<root>/<node>/<job>/<32 hex chars>`` (directories 0700, and refused if another user's
or looser: :mod:`fedfaas.objstore.root`; objects 0600 while writable, 0400 once sealed), pool
buffers as ``.pool-<hex>`` in the same folder. No
``multiprocessing.shared_memory``: its ``resource_tracker`` unlinks segments it did not create.

Two sides share one folder:

- :class:`Namespace` (the owner, the node gateway): allocates from a pool of pre-faulted
  buffers, seals, counts leases and frees (back to the pool by rename, or unlink), and on
  ``close`` leaves the root as it found it.
- :class:`StoreClient` (aggregator functions): maps sealed objects read-only, and writes into
  unsealed objects the owner allocated for it (its accumulator), then seals them.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import stat
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fedfaas.objstore.errors import ObjectNotFound, ObjectSealed, StoreError, StoreFull
from fedfaas.objstore.root import private_dir

log = logging.getLogger(__name__)

KEY_BYTES = 16
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{32}$")
_POOL_PREFIX = ".pool-"


def key_hex(key: bytes | str) -> str:
    """Validate a key (16 bytes or 32 lower-case hex chars) and return its hex form."""
    if isinstance(key, bytes | bytearray):
        if len(key) != KEY_BYTES:
            raise StoreError(f"a key is {KEY_BYTES} bytes, got {len(key)}")
        return bytes(key).hex()
    if not _HEX.match(key):
        raise StoreError(f"malformed object key {key!r:.40}")
    return key


def check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise StoreError(f"{kind} name {name!r:.70} must match {_NAME.pattern}")
    return name


class MappedObject:
    """One mapped object. ``buf`` is a memoryview of the mapping (read-only unless writable).

    Views from :meth:`ndarray` and :meth:`tensor` share the memory (no copy). Close the object
    when done; a mapping with live views is released when the last view dies.
    """

    def __init__(self, path: Path, key: str, writable: bool, mm: mmap.mmap | None = None) -> None:
        self.path = path
        self.key = key
        self.writable = writable
        self._owned = mm is None
        if mm is not None:  # a persistent mapping owned by the namespace's pool
            self._mm = mm
            self.nbytes = len(mm)
            self.buf: memoryview = memoryview(mm)
            return
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        try:
            self.nbytes = os.fstat(fd).st_size
            if writable:
                self._mm = mmap.mmap(
                    fd,
                    self.nbytes,
                    flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
            else:
                self._mm = mmap.mmap(
                    fd, self.nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
                )
        finally:
            os.close(fd)
        self.buf = memoryview(self._mm)

    @property
    def key_bytes(self) -> bytes:
        return bytes.fromhex(self.key)

    def ndarray(self, dtype: Any = np.float32, offset: int = 0, count: int = -1) -> np.ndarray:
        """A numpy view (read-only for read mappings)."""
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=offset)

    def tensor(self, offset: int = 0, count: int = -1) -> Any:
        """A float32 torch tensor viewing the mapping (no copy). Never write through a read map."""
        import torch

        arr = self.ndarray(np.float32, offset, count)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable numpy views
            return torch.from_numpy(arr)

    def close(self) -> None:
        try:
            self.buf.release()
            if self._owned:
                self._mm.close()
        except BufferError:
            log.debug("object %s still has live views; unmapped when they die", self.key)

    def __enter__(self) -> MappedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_sealed(path: Path) -> bool:
    return not (os.stat(path).st_mode & stat.S_IWUSR)


def _seal(path: Path, key: str) -> None:
    try:
        os.chmod(path, 0o400)
    except FileNotFoundError:
        raise ObjectNotFound(key) from None


class StoreClient:
    """Function-side access to one namespace folder (created by the node's gateway)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise StoreError(f"no object store namespace at {self.path}")

    @classmethod
    def from_dir_fd(cls, fd: int) -> StoreClient:
        """A client of the folder open as directory ``fd`` (a grant from the node's router).

        The fd is borrowed: it must stay open while the client is used.
        """
        return cls(Path(f"/proc/self/fd/{fd}"))

    def _path(self, key: bytes | str) -> tuple[Path, str]:
        k = key_hex(key)
        return self.path / k, k

    def open(self, key: bytes | str) -> MappedObject:
        """Map an object read-only."""
        p, k = self._path(key)
        return MappedObject(p, k, writable=False)

    def open_writable(self, key: bytes | str) -> MappedObject:
        """Map an unsealed object read-write; raises :class:`ObjectSealed` once sealed."""
        p, k = self._path(key)
        try:
            if _is_sealed(p):
                raise ObjectSealed(k)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None
        return MappedObject(p, k, writable=True)

    def seal(self, key: bytes | str) -> None:
        """Make an object read-only for everyone from now on."""
        p, k = self._path(key)
        _seal(p, k)

    def sealed(self, key: bytes | str) -> bool:
        p, k = self._path(key)
        try:
            return _is_sealed(p)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None

    def exists(self, key: bytes | str) -> bool:
        return self._path(key)[0].exists()


class Namespace(StoreClient):
    """Owner side of one node's namespace for one job: pool, allocation, leases, clean-up.

    Parameters
    ----------
    root : path
        Store root (default of a gateway: :data:`~fedfaas.objstore.root.DEFAULT_ROOT`). It,
        and the node and job folders, must be private to this user: see
        :func:`~fedfaas.objstore.root.private_dir` (raises :class:`UnsafeStoreRoot`).
    node, job : str
        Node and job names (lower-case, digits, ``-_.``).
    object_nbytes : int
        Size of every object of the job.
    pool : int
        Buffers pre-faulted now.
    pool_max : int or None
        Freed buffers kept (mapped) for reuse, up to this many (default ``pool``); the pool
        grows to the job's real peak instead of being sized for the worst case up front.
    max_objects : int or None
        Cap on live objects (pooled buffers not counted).
    """

    def __init__(
        self,
        root: str | Path,
        node: str,
        job: str,
        object_nbytes: int,
        *,
        pool: int = 0,
        pool_max: int | None = None,
        max_objects: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.object_nbytes = int(object_nbytes)
        self.max_objects = max_objects
        self.pool_target = max(pool, pool_max or 0)  # freed buffers kept for reuse, up to this
        path = self.root / check_name("node", node) / check_name("job", job)
        for d in (self.root, self.root / node, path):
            private_dir(d)
        super().__init__(path)
        self._lock = threading.Lock()
        self._leases: dict[str, int] = {}
        self.peak_objects = 0
        self._maps: dict[str, mmap.mmap] = {}  # live objects' persistent writable maps
        self._pool: list[tuple[Path, mmap.mmap]] = []
        for stale in self.path.glob(f"{_POOL_PREFIX}*"):  # pool buffers of a previous owner
            stale.unlink(missing_ok=True)
        for _ in range(pool):
            self._pool.append(self._new_buffer())

    # -- buffers ---------------------------------------------------------------------------
    def _new_buffer(self) -> tuple[Path, mmap.mmap]:
        """A pre-faulted buffer: pages allocated (fallocate) and mapped (MAP_POPULATE) once.

        The owner keeps this mapping for the buffer's whole life, across reuse, so neither
        page allocation nor page-table set-up is paid again per object.
        """
        p = self.path / f"{_POOL_PREFIX}{os.urandom(8).hex()}"
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.posix_fallocate(fd, 0, self.object_nbytes)  # tmpfs: allocates the pages now
            mm = mmap.mmap(
                fd,
                self.object_nbytes,
                flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        finally:
            os.close(fd)
        return p, mm

    def allocate(self) -> MappedObject:
        """A new writable object under a fresh random key, holding one lease (the caller's)."""
        with self._lock:
            if self.max_objects is not None and len(self._leases) >= self.max_objects:
                raise StoreFull(self.max_objects)
            k = os.urandom(KEY_BYTES).hex()
            src = self._pool.pop() if self._pool else None
            self._leases[k] = 1
            self.peak_objects = max(self.peak_objects, len(self._leases))
        dst = self.path / k
        try:
            if src is None:
                src = self._new_buffer()
            os.rename(src[0], dst)
            with self._lock:
                self._maps[k] = src[1]
            return MappedObject(dst, k, writable=True, mm=src[1])
        except BaseException:
            with self._lock:
                self._leases.pop(k, None)
                self._maps.pop(k, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dst)
            raise

    def adopt(self, key: bytes | str) -> bool:
        """Take ownership (one lease) of a sealed object left by a previous owner process.

        Used by a restarted gateway to recover what it had journaled. Returns False if the
        object is gone or was never sealed (an unsealed one may be half-written).
        """
        p, k = self._path(key)
        try:
            if not _is_sealed(p) or os.stat(p).st_size != self.object_nbytes:
                return False
        except FileNotFoundError:
            return False
        with self._lock:
            self._leases.setdefault(k, 1)
        return True

    def sweep(self) -> int:
        """Delete objects in the folder that this owner does not hold (left by a crash)."""
        with self._lock:
            live = set(self._leases)
        n = 0
        for p in self.path.iterdir():
            if p.name not in live and not p.name.startswith(_POOL_PREFIX):
                p.unlink(missing_ok=True)
                n += 1
        return n

    # -- leases ----------------------------------------------------------------------------
    def retain(self, key: bytes | str, n: int = 1) -> int:
        """Add ``n`` leases; returns the new count."""
        k = key_hex(key)
        with self._lock:
            if k not in self._leases:
                raise ObjectNotFound(k)
            self._leases[k] += n
            return self._leases[k]

    def release(self, key: bytes | str) -> bool:
        """Drop one lease; the object is freed when none is left. Returns True if freed."""
        k = key_hex(key)
        with self._lock:
            if k not in self._leases:
                raise ObjectNotFound(k)
            self._leases[k] -= 1
            if self._leases[k] > 0:
                return False
            del self._leases[k]
        self._recycle(k)
        return True

    def free(self, key: bytes | str) -> None:
        """Free an object now, whatever its leases (used for rejected uploads)."""
        k = key_hex(key)
        with self._lock:
            if self._leases.pop(k, None) is None:
                raise ObjectNotFound(k)
        self._recycle(k)

    def leases(self, key: bytes | str) -> int:
        return self._leases.get(key_hex(key), 0)

    def _recycle(self, k: str) -> None:
        p = self.path / k
        with self._lock:
            keep = len(self._pool) < self.pool_target
            mm = self._maps.pop(k, None)
        try:
            if keep and mm is not None:
                os.chmod(p, 0o600)
                q = self.path / f"{_POOL_PREFIX}{os.urandom(8).hex()}"
                os.rename(p, q)
                with self._lock:
                    self._pool.append((q, mm))
                return
            os.unlink(p)
        except FileNotFoundError:
            log.warning("object %s vanished before it was freed", k)
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def trim_pool(self, keep: int = 0) -> int:
        """Free pooled buffers beyond ``keep`` (a finished job needs none); returns how many."""
        with self._lock:
            self.pool_target = keep
            drop, self._pool = self._pool[keep:], self._pool[:keep]
        for p, mm in drop:
            p.unlink(missing_ok=True)
            with contextlib.suppress(BufferError):
                mm.close()
        return len(drop)

    def keys(self) -> list[str]:
        """Keys of live objects."""
        with self._lock:
            return sorted(self._leases)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "objects": len(self._leases),
                "pooled": len(self._pool),
                "peak_objects": self.peak_objects,
                "object_nbytes": self.object_nbytes,
                "bytes": (len(self._leases) + len(self._pool)) * self.object_nbytes,
            }

    def detach(self) -> None:
        """Unmap everything but leave live objects on disk for a later owner to :meth:`adopt`."""
        with self._lock:
            pool = list(self._pool)
            maps = [m for _, m in pool] + list(self._maps.values())
            self._leases.clear()
            self._pool.clear()
            self._maps.clear()
        for p, _ in pool:
            p.unlink(missing_ok=True)
        for m in maps:
            with contextlib.suppress(BufferError):
                m.close()

    def close(self) -> None:
        """Delete every object and pool buffer, and the folders this namespace created."""
        with self._lock:
            maps = [m for _, m in self._pool] + list(self._maps.values())
            self._leases.clear()
            self._pool.clear()
            self._maps.clear()
        for m in maps:
            with contextlib.suppress(BufferError):
                m.close()
        if self.path.exists():
            for p in self.path.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        # each folder goes only if empty: another job or node may still live there
        for d in (self.path, self.path.parent, self.root):
            with contextlib.suppress(OSError):
                d.rmdir()
