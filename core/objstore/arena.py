"""One job's pool as one file: the arena, mapped once by every replica granted the job.

Layout of ``<namespace>/.arena`` (little-endian)::

    0        header (64 B): magic, version, max_slots, object_nbytes, stride, data_off
    64       slot table: max_slots entries of 32 B (key 16 B, state u32, generation u32, 8 B pad)
    data_off slot 0, slot 1, ... each ``stride`` bytes (object_nbytes rounded up to a page)

An object in the arena has a key that says where it lives: bytes 0-3 its slot (u32), 4-7 the
slot's generation when it was allocated (u32), 8-15 random. A reader maps the whole file once
(read-only) and finds an object by its key with no system call: the slot's table entry must
hold the same key, sealed. A key whose slot is :data:`STANDALONE` names an object outside the
arena (a plain file, for the rare case of a full arena): :mod:`core.objstore.store`.

The owner (the node gateway, :class:`ArenaOwner`) is the only one that allocates and frees;
it keeps one pre-faulted read-write mapping per slot for its whole life. A reader
(:class:`ArenaReader`, an ``aggregator`` endpoint) writes only two things: the objects the
owner allocated for it (through a read-write mapping of their slot, kept for the next object
there) and their table entry's state when it seals them. Memory goes back to the system by
punching a hole over a slot (``fallocate``), which also frees pages every reader still maps;
reading a hole gives zeros and a failed key check, never a fault: the file is never truncated
while it is mapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from core.objstore.errors import ObjectNotFound, ObjectSealed, StoreError

ARENA_NAME = ".arena"
MAGIC = b"FFARENA1"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ")  # magic, version, max_slots, object_nbytes, stride, data_off
HEADER_SIZE = 64
ENTRY = struct.Struct("<16sII8x")
ENTRY_SIZE = 32
PAGE = mmap.PAGESIZE
#: slot number of a key that names an object outside the arena
STANDALONE = 0xFFFF_FFFF
FREE, WRITABLE, SEALED = 0, 1, 2
_EMPTY_KEY = bytes(16)
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Give the pages of ``[offset, offset+length)`` back (every mapping of them sees zeros)."""
    if length <= 0:
        return
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"fallocate(PUNCH_HOLE): {os.strerror(e)}")


def map_slot(fd: int, layout: Layout, slot: int) -> mmap.mmap:
    """A read-write mapping of ``slot`` of the arena open as ``fd``, its pages faulted in now."""
    return mmap.mmap(
        fd, layout.stride, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, offset=layout.offset(slot)
    )


def key_slot(key: bytes) -> int:
    """The slot a 16-byte key names (:data:`STANDALONE` for an object outside the arena)."""
    return int.from_bytes(key[:4], "little")


def make_key(slot: int, generation: int) -> bytes:
    """A fresh key for ``slot`` at ``generation`` (8 random bytes make it unguessable)."""
    return (
        slot.to_bytes(4, "little")
        + (generation & 0xFFFF_FFFF).to_bytes(4, "little")
        + (os.urandom(8))
    )


def standalone_key() -> bytes:
    return STANDALONE.to_bytes(4, "little") + os.urandom(12)


@dataclass(frozen=True)
class Layout:
    """Where things are in an arena of ``max_slots`` objects of ``object_nbytes`` each."""

    max_slots: int
    object_nbytes: int

    @property
    def stride(self) -> int:
        return -(-self.object_nbytes // PAGE) * PAGE

    @property
    def data_off(self) -> int:
        return -(-(HEADER_SIZE + ENTRY_SIZE * self.max_slots) // PAGE) * PAGE

    def offset(self, slot: int) -> int:
        return self.data_off + slot * self.stride

    def slots_in(self, file_size: int) -> int:
        """Whole slots a file of ``file_size`` bytes holds."""
        return max(0, (file_size - self.data_off) // self.stride)

    def header(self) -> bytes:
        return HEADER.pack(
            MAGIC, VERSION, self.max_slots, self.object_nbytes, self.stride, self.data_off
        ).ljust(HEADER_SIZE, b"\0")

    @classmethod
    def read(cls, fd: int) -> Layout:
        raw = os.pread(fd, HEADER.size, 0)
        if len(raw) < HEADER.size:
            raise StoreError("arena file too short for its header")
        magic, version, max_slots, nbytes, stride, data_off = HEADER.unpack(raw)
        if magic != MAGIC or version != VERSION:
            raise StoreError(f"not a FedFaaS arena (magic {magic!r}, version {version})")
        lay = cls(max_slots, nbytes)
        if (stride, data_off) != (lay.stride, lay.data_off):
            raise StoreError("arena header is inconsistent (stride or data offset)")
        return lay


class _Table:
    """The slot table, read and written in place through a small read-write mapping. The one
    place the rules of a slot's states live: only a sealed object is read in place, only a
    writable one is mapped for writing, and only a writable one becomes sealed."""

    def __init__(self, fd: int, layout: Layout, *, writable: bool = True) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.mm = mmap.mmap(fd, layout.data_off, flags=mmap.MAP_SHARED, prot=prot)

    def get(self, slot: int) -> tuple[bytes, int, int]:
        key, state, gen = ENTRY.unpack_from(self.mm, HEADER_SIZE + ENTRY_SIZE * slot)
        return key, state, gen

    def put(self, slot: int, key: bytes, state: int, gen: int) -> None:
        # the state word last: a reader that sees SEALED sees the key it was sealed with
        off = HEADER_SIZE + ENTRY_SIZE * slot
        self.mm[off : off + 16] = key
        struct.pack_into("<I", self.mm, off + 20, gen)
        struct.pack_into("<I", self.mm, off + 16, state)

    def entry(self, key: bytes, nslots: int) -> tuple[int, int]:
        """The slot of ``key`` and its state; :class:`ObjectNotFound` unless the table holds it."""
        slot = key_slot(key)
        if slot >= nslots:
            raise ObjectNotFound(key.hex())
        k, state, _ = self.get(slot)
        if k != key or state == FREE:
            raise ObjectNotFound(key.hex())
        return slot, state

    def readable(self, key: bytes, nslots: int) -> int:
        """The slot of a sealed object (:class:`StoreError` while it is still written)."""
        slot, state = self.entry(key, nslots)
        if state != SEALED:
            raise StoreError(f"object {key.hex()} is not sealed yet; only sealed objects are read")
        return slot

    def writable(self, key: bytes, nslots: int) -> int:
        """The slot of an object not sealed yet (:class:`ObjectSealed` once it is)."""
        slot, state = self.entry(key, nslots)
        if state != WRITABLE:
            raise ObjectSealed(key.hex())
        return slot

    def seal(self, key: bytes, nslots: int) -> None:
        """Mark a writable object sealed (a sealed one stays as it is)."""
        slot, state = self.entry(key, nslots)
        if state == WRITABLE:
            struct.pack_into("<I", self.mm, HEADER_SIZE + ENTRY_SIZE * slot + 16, SEALED)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()


class ArenaOwner:
    """The gateway's side of one arena: slots, their table entries and their memory.

    Not thread-safe: :class:`~core.objstore.store.Namespace` calls it under its lock.
    ``existing`` (after :meth:`open`) lists the slots a previous owner left in use: they are
    neither free nor owned until :meth:`~core.objstore.store.Namespace.adopt` or ``sweep``.
    """

    def __init__(self, path: Path, layout: Layout, fd: int, nslots: int) -> None:
        self.path = path
        self.layout = layout
        self.fd = fd
        self.table = _Table(fd, layout)
        self.maps: list[mmap.mmap | None] = [None] * nslots
        self.free: list[int] = []  # pages allocated and mapped: taken first
        self.holes: list[int] = []  # pages given back: allocated again when taken
        self.existing: set[int] = set()
        self.closed = False

    @classmethod
    def open(cls, folder: Path, object_nbytes: int, max_slots: int) -> ArenaOwner:
        """The folder's arena: a previous owner's when it fits these sizes, else a new one
        (an old one that does not fit holds nothing that could be adopted, and is removed)."""
        path = folder / ARENA_NAME
        want = Layout(max_slots, object_nbytes)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                if Layout.read(fd) == want:
                    return cls._resume(path, want, fd)
            except StoreError:
                pass
            punch_hole(fd, 0, os.fstat(fd).st_size)
            os.close(fd)
            path.unlink()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, want.data_off)
            os.pwrite(fd, want.header(), 0)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, want, fd, 0)

    @classmethod
    def _resume(cls, path: Path, layout: Layout, fd: int) -> ArenaOwner:
        n = layout.slots_in(os.fstat(fd).st_size)
        owner = cls(path, layout, fd, n)
        for i in range(n):
            _, state, _ = owner.table.get(i)
            if state == FREE:
                owner._punch(i)  # its memory is unknown: given back, allocated when taken
                owner.holes.append(i)
            else:
                owner.existing.add(i)
        return owner

    @property
    def nslots(self) -> int:
        return len(self.maps)

    def _map(self, slot: int) -> mmap.mmap:
        mm = self.maps[slot]
        if mm is None:
            mm = self.maps[slot] = map_slot(self.fd, self.layout, slot)
        return mm

    def _back(self, slot: int) -> None:
        """Allocate the slot's pages (tmpfs: now) and map them pre-faulted."""
        os.posix_fallocate(self.fd, self.layout.offset(slot), self.layout.stride)
        old, self.maps[slot] = self.maps[slot], None
        if old is not None:  # its page tables were zapped with the hole: map it afresh
            with contextlib.suppress(BufferError):
                old.close()
        self._map(slot)

    def _punch(self, slot: int) -> None:
        punch_hole(self.fd, self.layout.offset(slot), self.layout.stride)

    def _grow_free(self) -> bool:
        """Add one pre-faulted slot to the free list: a hole backed again, else a new slot at
        the end of the file. False when the arena is full."""
        if self.holes:
            slot = self.holes.pop()
        elif self.nslots < self.layout.max_slots:
            slot = self.nslots
            os.ftruncate(self.fd, self.layout.offset(slot + 1))
            self.maps.append(None)
        else:
            return False
        try:
            self._back(slot)
        except OSError:  # ENOSPC (the file system is full): the slot stays a hole, no pages
            with contextlib.suppress(OSError):
                self._punch(slot)
            self.holes.append(slot)
            raise
        self.free.append(slot)
        return True

    def prefault(self, n: int) -> None:
        """Have at least ``n`` free slots pre-faulted (fewer when the arena is full).

        Raises the system's ``OSError`` (``ENOSPC``: the memory file system is full) with
        the slots faulted so far kept."""
        while len(self.free) < n and self._grow_free():
            pass

    def take(self) -> tuple[int, bytes] | None:
        """A slot for a new object, marked writable under a fresh key; None when full."""
        if not self.free and not self._grow_free():
            return None
        slot = self.free.pop()
        _, _, gen = self.table.get(slot)
        gen = (gen + 1) & 0xFFFF_FFFF
        key = make_key(slot, gen)
        self.table.put(slot, key, WRITABLE, gen)
        return slot, key

    def give_back(self, slot: int, keep: bool) -> None:
        """The slot's object is freed: kept mapped for reuse (``keep``) or its pages returned."""
        _, _, gen = self.table.get(slot)
        self.table.put(slot, _EMPTY_KEY, FREE, gen)
        self.existing.discard(slot)
        if keep:
            self.free.append(slot)
        else:
            self._punch(slot)
            self.holes.append(slot)

    def trim(self, keep: int) -> int:
        """Return the pages of free slots beyond ``keep``; how many were returned."""
        drop, self.free = self.free[keep:], self.free[:keep]
        for slot in drop:
            self._punch(slot)
        self.holes.extend(drop)
        return len(drop)

    def view(self, slot: int) -> memoryview:
        """The slot's object bytes through the owner's read-write mapping."""
        return memoryview(self._map(slot))[: self.layout.object_nbytes]

    def close(self, *, keep_objects: bool) -> None:
        """Unmap and close. Without ``keep_objects`` every page is given back first (so an
        endpoint still mapping the file holds no memory) and the file is removed."""
        if self.closed:
            return
        self.closed = True
        if not keep_objects:
            with contextlib.suppress(OSError):
                punch_hole(self.fd, 0, os.fstat(self.fd).st_size)
        for mm in self.maps:
            if mm is not None:
                with contextlib.suppress(BufferError):
                    mm.close()
        self.maps = []
        self.table.close()
        os.close(self.fd)
        if not keep_objects:
            self.path.unlink(missing_ok=True)


class ArenaReader:
    """An endpoint's view of a job's arena: one read-only mapping of the whole file, and one
    read-write mapping per slot it writes, made (pre-faulted) the first time it writes an
    object there and kept for the next object the owner allocates in that slot: the owner
    reuses its slots, so a warm endpoint maps no page again round after round. Safe to share
    between the threads of one process (:meth:`~core.objstore.client.StoreClient.from_dir_fd`
    with ``shared``).

    A new object past the mapped end (the owner grew the file) maps the file again, once.
    """

    def __init__(self, folder: Path, *, writable: bool = True) -> None:
        path = folder / ARENA_NAME
        mode = os.O_RDWR if writable else os.O_RDONLY  # an aggregator writes its partials
        try:
            self.fd = os.open(path, mode | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise StoreError(f"no arena in {folder}") from None
        try:
            self.layout = Layout.read(self.fd)
            self.table = _Table(self.fd, self.layout, writable=writable)
        except BaseException:
            os.close(self.fd)
            raise
        self._old: list[mmap.mmap] = []
        self.data: mmap.mmap | None = None
        self.nslots = 0
        self.remaps = 0
        #: slot -> its read-write mapping, kept for the next object written there
        self._writable: dict[int, mmap.mmap] = {}
        #: read-write slot mappings made (each once, however many objects it held)
        self.writable_maps = 0
        self._lock = threading.Lock()
        self._remap()

    def _remap(self) -> None:
        """Map the file again if it grew (a key past the end of a file that did not grow
        names nothing, and costs one ``fstat``, not a mapping)."""
        with self._lock:
            size = os.fstat(self.fd).st_size
            n = self.layout.slots_in(size)
            if self.data is not None and n <= self.nslots:
                return
            if self.data is not None:
                self._old.append(self.data)  # views of it may still be read
            self.data = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            self.nslots = n
            self.remaps += 1

    def _slots(self, key: bytes) -> int:
        """Slots mapped, the file mapped again first if ``key`` is past them and it grew."""
        if key_slot(key) >= self.nslots:
            self._remap()
        return self.nslots

    def view(self, key: bytes) -> memoryview:
        """A read-only view of a sealed object: no system call once the slot is mapped."""
        slot = self.table.readable(key, self._slots(key))
        assert self.data is not None
        off = self.layout.offset(slot)
        return memoryview(self.data)[off : off + self.layout.object_nbytes]

    def map_writable(self, key: bytes) -> mmap.mmap:
        """The read-write mapping of the slot of an object allocated for this reader and not
        sealed yet (the reader's: kept until :meth:`close`, never closed by its user)."""
        slot = self.table.writable(key, self._slots(key))
        with self._lock:
            mm = self._writable.get(slot)
            if mm is None:
                mm = self._writable[slot] = map_slot(self.fd, self.layout, slot)
                self.writable_maps += 1
            return mm

    def seal(self, key: bytes) -> None:
        self.table.seal(key, self._slots(key))

    def state(self, key: bytes) -> int:
        return self.table.entry(key, self._slots(key))[1]

    def close(self) -> None:
        for mm in [*self._old, self.data, *self._writable.values()]:
            if mm is not None:
                with contextlib.suppress(BufferError):
                    mm.close()
        self._old, self.data, self._writable = [], None, {}
        self.table.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
