"""Shared-memory object store: one arena file per job namespace under /dev/shm, plus mmap.

Layout: ``<root>/<node>/<job>/.arena`` (directories 0700, and refused if another user's or
looser: :mod:`fedfaas.objstore.root`; the arena 0600). Every object of a job has the same
size, so the job's pool is one file of equal slots (:mod:`fedfaas.objstore.arena`) that an
endpoint maps once when it is granted the job: handing it an object then costs no open, mmap
or page fault. When the arena is full (its slot table is sized at creation), an object is a
plain file ``<32 hex chars>`` beside it (0600 while writable, 0400 once sealed), the path every
object took before the arena. No ``multiprocessing.shared_memory``: its ``resource_tracker``
unlinks segments it did not create.

Two sides share one folder:

- :class:`Namespace` (the owner, the node gateway): allocates from pre-faulted slots, seals,
  counts leases and frees (the slot is kept for reuse, or its pages given back past the pool
  target), and on ``close`` leaves the root as it found it.
- :class:`StoreClient` (aggregator functions): reads sealed objects in place, read-only, and
  writes into unsealed objects the owner allocated for it (its accumulator), then seals them.
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

from fedfaas.objstore.arena import (
    ARENA_NAME,
    SEALED,
    STANDALONE,
    WRITABLE,
    ArenaOwner,
    ArenaReader,
    check_entry,
    key_slot,
    standalone_key,
)
from fedfaas.objstore.errors import ObjectNotFound, ObjectSealed, StoreError, StoreFull
from fedfaas.objstore.root import private_dir

log = logging.getLogger(__name__)

KEY_BYTES = 16
#: slots of a job's arena (its table is 32 bytes a slot); objects past it are plain files
DEFAULT_ARENA_SLOTS = 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{32}$")


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


def in_arena(key: bytes | str) -> bool:
    """Whether an object lives in its job's arena (else it is a plain file)."""
    return key_slot(bytes.fromhex(key_hex(key))) != STANDALONE


class MappedObject:
    """One object's bytes. ``buf`` is a memoryview (read-only unless writable).

    Views from :meth:`ndarray` and :meth:`tensor` share the memory (no copy). Close the object
    when done; an object's own mapping with live views is released when the last view dies.
    """

    def __init__(
        self, key: str, buf: memoryview, *, writable: bool, mm: mmap.mmap | None = None
    ) -> None:
        self.key = key
        self.buf = buf
        self.writable = writable
        self.nbytes = len(buf)
        self._mm = mm  # a mapping of this object alone, unmapped on close

    @classmethod
    def map_file(cls, path: Path, key: str, writable: bool) -> MappedObject:
        """Map a plain-file object (read-only, or read-write), pre-faulted."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(
                fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=prot
            )
        finally:
            os.close(fd)
        return cls(key, memoryview(mm), writable=writable, mm=mm)

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
            if self._mm is not None:
                self._mm.close()
        except BufferError:
            log.debug("object %s still has live views; unmapped when they die", self.key)

    def __enter__(self) -> MappedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_sealed(path: Path) -> bool:
    return not (os.stat(path).st_mode & stat.S_IWUSR)


class StoreClient:
    """Function-side access to one namespace folder (created by the node's gateway).

    The job's arena is mapped once, read-only, when the client is made (an endpoint makes one
    per grant); :meth:`close` unmaps it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise StoreError(f"no object store namespace at {self.path}")
        self._reader: ArenaReader | None = None
        if type(self) is StoreClient and (self.path / ARENA_NAME).exists():
            self._reader = ArenaReader(self.path)

    @classmethod
    def from_dir_fd(cls, fd: int) -> StoreClient:
        """A client of the folder open as directory ``fd`` (a grant from the node's router).

        The fd is borrowed: it must stay open while the client is used.
        """
        return cls(Path(f"/proc/self/fd/{fd}"))

    def _file(self, key: bytes | str) -> tuple[Path, str]:
        k = key_hex(key)
        return self.path / k, k

    def _arena_reader(self, k: str) -> ArenaReader:
        if self._reader is None:
            raise ObjectNotFound(k)  # an arena key in a folder without an arena
        return self._reader

    def open(self, key: bytes | str) -> MappedObject:
        """Read a sealed object in place (read-only)."""
        k = key_hex(key)
        if not in_arena(k):
            return MappedObject.map_file(self.path / k, k, writable=False)
        return MappedObject(k, self._arena_view(k), writable=False)

    def _arena_view(self, k: str) -> memoryview:
        return self._arena_reader(k).view(bytes.fromhex(k))

    def open_writable(self, key: bytes | str) -> MappedObject:
        """Map an unsealed object read-write; raises :class:`ObjectSealed` once sealed."""
        k = key_hex(key)
        if in_arena(k):
            return self._arena_writable(k)
        p = self.path / k
        try:
            if _file_sealed(p):
                raise ObjectSealed(k)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None
        return MappedObject.map_file(p, k, writable=True)

    def _arena_writable(self, k: str) -> MappedObject:
        mm = self._arena_reader(k).map_writable(bytes.fromhex(k))
        nbytes = self._arena_reader(k).layout.object_nbytes
        return MappedObject(k, memoryview(mm)[:nbytes], writable=True, mm=mm)

    def seal(self, key: bytes | str) -> None:
        """Make an object read-only for everyone from now on."""
        k = key_hex(key)
        if in_arena(k):
            self._arena_seal(k)
            return
        try:
            os.chmod(self.path / k, 0o400)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None

    def _arena_seal(self, k: str) -> None:
        self._arena_reader(k).seal(bytes.fromhex(k))

    def sealed(self, key: bytes | str) -> bool:
        k = key_hex(key)
        if in_arena(k):
            return self._arena_state(k) == SEALED
        try:
            return _file_sealed(self.path / k)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None

    def _arena_state(self, k: str) -> int:
        return self._arena_reader(k).state(bytes.fromhex(k))

    def exists(self, key: bytes | str) -> bool:
        k = key_hex(key)
        if not in_arena(k):
            return (self.path / k).exists()
        try:
            self._arena_state(k)
        except ObjectNotFound:
            return False
        return True

    @property
    def arena_remaps(self) -> int:
        """How many times this client mapped the arena (1, plus one each time it grew)."""
        return 0 if self._reader is None else self._reader.remaps

    def close(self) -> None:
        """Unmap the arena (views still alive keep their pages until they die)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class Namespace(StoreClient):
    """Owner side of one node's namespace for one job: slots, allocation, leases, clean-up.

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
        Slots pre-faulted now.
    pool_max : int or None
        Freed slots kept pre-faulted for reuse, up to this many (default ``pool``); past it a
        freed slot's pages go back to the system. The pool grows to the job's real peak
        instead of being sized for the worst case up front.
    max_objects : int or None
        Cap on live objects (free slots not counted).
    arena_slots : int or None
        Slots the arena may grow to (default :data:`DEFAULT_ARENA_SLOTS`); objects past
        them are plain files.

    A folder that already holds an arena of the same sizes (a previous owner killed, or
    detached) is taken over: its objects can be :meth:`adopt`-ed until :meth:`sweep`.
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
        arena_slots: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.object_nbytes = int(object_nbytes)
        self.max_objects = max_objects
        self.pool_target = max(pool, pool_max or 0)  # freed slots kept for reuse, up to this
        path = self.root / check_name("node", node) / check_name("job", job)
        for d in (self.root, self.root / node, path):
            private_dir(d)
        super().__init__(path)
        self._lock = threading.Lock()
        self._leases: dict[str, int] = {}
        self.peak_objects = 0
        self._files: dict[str, mmap.mmap] = {}  # plain-file objects' writable maps
        self._arena = ArenaOwner.open(path, self.object_nbytes, arena_slots or DEFAULT_ARENA_SLOTS)
        self._arena.prefault(pool)

    # -- the owner's own access: through its per-slot mappings ------------------------------
    def _arena_slot(self, k: str) -> tuple[int, int]:
        return check_entry(self._arena.table, bytes.fromhex(k), self._arena.nslots)

    def _arena_view(self, k: str) -> memoryview:
        with self._lock:
            slot, state = self._arena_slot(k)
            if state != SEALED:
                raise StoreError(f"object {k} is not sealed yet; only sealed objects are read")
            return self._arena.view(slot).toreadonly()

    def _arena_writable(self, k: str) -> MappedObject:
        with self._lock:
            slot, state = self._arena_slot(k)
            if state != WRITABLE:
                raise ObjectSealed(k)
            return MappedObject(k, self._arena.view(slot), writable=True)

    def _arena_seal(self, k: str) -> None:
        with self._lock:
            slot, state = self._arena_slot(k)
            if state == WRITABLE:
                self._arena.table.set_state(slot, SEALED)

    def _arena_state(self, k: str) -> int:
        with self._lock:
            return self._arena_slot(k)[1]

    # -- allocation ------------------------------------------------------------------------
    def allocate(self) -> MappedObject:
        """A new writable object under a fresh key, holding one lease (the caller's)."""
        with self._lock:
            if self.max_objects is not None and len(self._leases) >= self.max_objects:
                raise StoreFull(self.max_objects)
            got = self._arena.take()
            if got is not None:
                slot, key = got
                k = key.hex()
                self._lease_new(k)
                return MappedObject(k, self._arena.view(slot), writable=True)
            k = standalone_key().hex()
            self._lease_new(k)
        try:  # the arena is full: a plain file, pre-faulted outside the lock
            mm = self._new_file(self.path / k)
            with self._lock:
                self._files[k] = mm
            return MappedObject(k, memoryview(mm), writable=True)
        except BaseException:
            with self._lock:
                self._leases.pop(k, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / k)
            raise

    def _lease_new(self, k: str) -> None:
        self._leases[k] = 1
        self.peak_objects = max(self.peak_objects, len(self._leases))

    def _new_file(self, p: Path) -> mmap.mmap:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.posix_fallocate(fd, 0, self.object_nbytes)  # tmpfs: allocates the pages now
            return mmap.mmap(fd, self.object_nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)

    def adopt(self, key: bytes | str) -> bool:
        """Take ownership (one lease) of a sealed object left by a previous owner process.

        Used by a restarted gateway to recover what it had journaled. Returns False if the
        object is gone or was never sealed (an unsealed one may be half-written).
        """
        k = key_hex(key)
        if in_arena(k):
            with self._lock:
                try:
                    _, state = self._arena_slot(k)
                except ObjectNotFound:
                    return False
                if state != SEALED:
                    return False
                if k in self._leases:
                    return True
                slot = key_slot(bytes.fromhex(k))
                if slot not in self._arena.existing:
                    return False
                self._arena.existing.discard(slot)
                self._leases[k] = 1
            return True
        p = self.path / k
        try:
            if not _file_sealed(p) or os.stat(p).st_size != self.object_nbytes:
                return False
        except FileNotFoundError:
            return False
        with self._lock:
            self._leases.setdefault(k, 1)
        return True

    def sweep(self) -> int:
        """Free objects a previous owner left that this owner did not adopt."""
        with self._lock:
            live = set(self._leases)
            left = sorted(self._arena.existing)
            for slot in left:
                self._arena.give_back(slot, keep=len(self._arena.free) < self.pool_target)
        n = len(left)
        for p in self.path.iterdir():
            if p.name != ARENA_NAME and p.name not in live:
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
        """Free ``k``'s storage (called under the lock, its lease gone)."""
        if in_arena(k):
            slot = key_slot(bytes.fromhex(k))
            self._arena.give_back(slot, keep=len(self._arena.free) < self.pool_target)
            return
        mm = self._files.pop(k, None)
        try:
            os.unlink(self.path / k)
        except FileNotFoundError:
            log.warning("object %s vanished before it was freed", k)
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def trim_pool(self, keep: int = 0) -> int:
        """Give back the pages of free slots beyond ``keep`` (a finished job needs none)."""
        with self._lock:
            self.pool_target = keep
            return self._arena.trim(keep)

    def keys(self) -> list[str]:
        """Keys of live objects."""
        with self._lock:
            return sorted(self._leases)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "objects": len(self._leases),
                "pooled": len(self._arena.free),
                "peak_objects": self.peak_objects,
                "object_nbytes": self.object_nbytes,
                "bytes": (len(self._leases) + len(self._arena.free)) * self.object_nbytes,
                "arena_slots": self._arena.nslots,
                "files": len(self._files),
            }

    def detach(self) -> None:
        """Unmap everything but leave live objects in place for a later owner to :meth:`adopt`."""
        with self._lock:
            self._leases.clear()
            maps = list(self._files.values())
            self._files.clear()
            self._arena.close(keep_objects=True)
        for m in maps:
            with contextlib.suppress(BufferError):
                m.close()

    def close(self) -> None:
        """Delete every object and the arena (its pages given back even where an endpoint
        still maps it), and the folders this namespace created."""
        with self._lock:
            self._leases.clear()
            maps = list(self._files.values())
            self._files.clear()
            self._arena.close(keep_objects=False)
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
