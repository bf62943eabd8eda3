"""Shared-memory object store: one arena file per job namespace under /dev/shm, plus mmap.

Layout: ``<root>/<node>/<job>/.arena`` (directories 0700, and refused if another user's or
looser: :mod:`core.objstore.root`; the arena 0600). Every object of a job has the same
size, so the job's pool is one file of equal slots (:mod:`core.objstore.arena`) that an
endpoint maps once when it is granted the job: handing it an object then costs no open, mmap
or page fault. When the arena is full (its slot table is sized at creation), an object is a
plain file ``<32 hex chars>`` beside it (0600 while writable, 0400 once sealed), the path every
object took before the arena. No ``multiprocessing.shared_memory``: its ``resource_tracker``
unlinks segments it did not create.

Two sides share one folder:

- :class:`Namespace` (the owner, the node gateway; this module): allocates from pre-faulted
  slots, seals, counts leases and frees (the slot is kept for reuse, or its pages given back
  past the pool target), and on ``close`` leaves the root as it found it.
- :class:`~core.objstore.client.StoreClient` (aggregator functions): reads sealed objects in
  place, read-only, and writes into unsealed objects the owner allocated for it (its
  accumulator), then seals them.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from pathlib import Path

from core.objstore.arena import (
    ARENA_NAME,
    SEALED,
    ArenaOwner,
    key_slot,
    standalone_key,
)
from core.objstore.client import (
    MappedObject,
    StoreClient,
    check_name,
    file_sealed,
    in_arena,
    key_hex,
    parse_key,
)
from core.objstore.errors import ObjectNotFound, StoreFull
from core.objstore.root import private_dir

log = logging.getLogger(__name__)

#: slots of a job's arena (its table is 32 bytes a slot); objects past it are plain files
DEFAULT_ARENA_SLOTS = 1024


class Namespace(StoreClient):
    """Owner side of one node's namespace for one job: slots, allocation, leases, clean-up.

    Parameters
    ----------
    root : path
        Store root (default of a gateway: :data:`~core.objstore.root.DEFAULT_ROOT`). It,
        and the node and job folders, must be private to this user: see
        :func:`~core.objstore.root.private_dir` (raises :class:`UnsafeStoreRoot`).
    node, job : str
        Node and job names (lower-case, digits, ``-_.``).
    object_nbytes : int
        Size of every object of the job.
    pool : int
        Slots pre-faulted now, as many as the memory file system has room for (a full one
        is logged, not raised: :meth:`allocate` then raises its ``OSError``).
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
        try:
            self._arena = ArenaOwner.open(
                path, self.object_nbytes, arena_slots or DEFAULT_ARENA_SLOTS
            )
        except OSError:  # e.g. ENOSPC writing its table: leave the root as it was found
            self._remove_folders()
            raise
        try:
            self._arena.prefault(pool)
        except OSError as exc:  # /dev/shm full: the pool grows as allocations find room
            log.warning(
                "%s: %d of %d pool slots pre-faulted: %s", path, len(self._arena.free), pool, exc
            )

    # -- the owner's own access: through its per-slot mappings ------------------------------
    def _arena_view(self, kb: bytes) -> memoryview:
        with self._lock:
            slot = self._arena.table.readable(kb, self._arena.nslots)
            return self._arena.view(slot).toreadonly()

    def _arena_writable(self, kb: bytes) -> tuple[memoryview, mmap.mmap | None]:
        with self._lock:
            return self._arena.view(self._arena.table.writable(kb, self._arena.nslots)), None

    def _arena_seal(self, kb: bytes) -> None:
        with self._lock:
            self._arena.table.seal(kb, self._arena.nslots)

    def _arena_state(self, kb: bytes) -> int:
        with self._lock:
            return self._arena.table.entry(kb, self._arena.nslots)[1]

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, nbytes: int | None = None) -> MappedObject:
        """A new writable object under a fresh key, holding one lease (the caller's).

        ``nbytes`` gives a plain file of that size outside the pool (a small manifest beside
        the model-sized objects), even when it happens to equal the job's object size: a
        pool slot is readable only once sealed, a manifest is read while it is written."""
        odd = nbytes is not None
        with self._lock:
            if self.max_objects is not None and len(self._leases) >= self.max_objects:
                raise StoreFull(self.max_objects)
            got = None if odd else self._arena.take()
            if got is not None:
                slot, key = got
                k = key.hex()
                self._lease_new(k)
                return MappedObject(k, self._arena.view(slot), writable=True)
            k = standalone_key().hex()
            self._lease_new(k)
        try:  # the arena is full: a plain file, pre-faulted outside the lock
            mm = self._new_file(self.path / k, nbytes if odd else None)
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

    def _new_file(self, p: Path, nbytes: int | None = None) -> mmap.mmap:
        size = nbytes or self.object_nbytes
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.posix_fallocate(fd, 0, size)  # tmpfs: allocates the pages now
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)

    def adopt(self, key: bytes | str) -> bool:
        """Take ownership (one lease) of a sealed object left by a previous owner process.

        Used by a restarted gateway to recover what it had journaled. Returns False if the
        object is gone or was never sealed (an unsealed one may be half-written).
        """
        kb, k = parse_key(key)
        if in_arena(kb):
            with self._lock:
                try:
                    slot, state = self._arena.table.entry(kb, self._arena.nslots)
                except ObjectNotFound:
                    return False
                if state != SEALED:
                    return False
                if k in self._leases:
                    return True
                if slot not in self._arena.existing:
                    return False
                self._arena.existing.discard(slot)
                self._leases[k] = 1
            return True
        p = self.path / k
        try:
            if not file_sealed(p) or os.stat(p).st_size != self.object_nbytes:
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
        kb = bytes.fromhex(k)
        if in_arena(kb):
            self._arena.give_back(key_slot(kb), keep=len(self._arena.free) < self.pool_target)
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
        self._remove_folders()

    def _remove_folders(self) -> None:
        # each folder goes only if empty: another job or node may still live there
        for d in (self.path, self.path.parent, self.root):
            with contextlib.suppress(OSError):
                d.rmdir()
