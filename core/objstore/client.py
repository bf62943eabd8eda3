"""The function side of the store: object keys, mapped objects, and :class:`StoreClient`.

An ``aggregator`` endpoint makes a :class:`StoreClient` of the job folder its grant carries (a
directory fd): the job's arena is mapped once, read-only, and every object a frame names is read
in place from it (:mod:`core.objstore.arena`); the endpoints of one replica share that mapping
and the read-write mappings of the slots they write (``shared``); a key outside the arena names
a plain file beside it. The owner's side, :class:`~core.objstore.store.Namespace`, builds on this class.
"""

from __future__ import annotations

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

from core.objstore.arena import ARENA_NAME, SEALED, STANDALONE, ArenaReader, key_slot
from core.objstore.errors import ObjectNotFound, ObjectSealed, StoreError

log = logging.getLogger(__name__)

KEY_BYTES = 16
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


def parse_key(key: bytes | str) -> tuple[bytes, str]:
    """A key validated once, in both forms: 16 bytes and 32 hex chars."""
    k = key_hex(key)
    return (bytes.fromhex(k) if isinstance(key, str) else bytes(key)), k


def in_arena(key: bytes) -> bool:
    """Whether the object a 16-byte key names lives in its job's arena (else a plain file)."""
    return key_slot(key) != STANDALONE


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


def file_sealed(path: Path) -> bool:
    return not (os.stat(path).st_mode & stat.S_IWUSR)


class StoreClient:
    """Function-side access to one namespace folder (created by the node's gateway).

    The job's arena is mapped once, read-only, when the client is made (an endpoint makes one
    per grant), or taken from this process's shared reader of it (``shared``); :meth:`close`
    unmaps it (a shared reader's mappings once its last client closes).
    """

    def __init__(self, path: str | Path, *, read_only: bool = False, shared: bool = False) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise StoreError(f"no object store namespace at {self.path}")
        self._reader: ArenaReader | None = None
        self._shared: tuple[int, int] | None = None
        if type(self) is StoreClient and (self.path / ARENA_NAME).exists():
            if shared and not read_only:
                self._shared, self._reader = _shared_reader(self.path)
            else:
                self._reader = ArenaReader(self.path, writable=not read_only)

    @classmethod
    def from_dir_fd(cls, fd: int, *, read_only: bool = False, shared: bool = False) -> StoreClient:
        """A client of the folder open as directory ``fd`` (a grant from the node's router, or
        a handoff's claim: ``read_only``, opening nothing for writing).

        ``shared`` (read-write clients): the clients of one job's arena in this process (the
        endpoints of one ``aggregator`` replica) share its mappings, so each page is mapped
        once per process, not once per endpoint; unmapped when the last of them closes.

        The fd is borrowed: it must stay open while the client is used.
        """
        return cls(Path(f"/proc/self/fd/{fd}"), read_only=read_only, shared=shared)

    # -- the arena's side of each call; the owner (Namespace) reaches it its own way -----------
    def _arena_reader(self, kb: bytes) -> ArenaReader:
        if self._reader is None:
            raise ObjectNotFound(kb.hex())  # an arena key in a folder without an arena
        return self._reader

    def _arena_view(self, kb: bytes) -> memoryview:
        return self._arena_reader(kb).view(kb)

    def _arena_writable(self, kb: bytes) -> tuple[memoryview, mmap.mmap | None]:
        reader = self._arena_reader(kb)
        mm = reader.map_writable(kb)  # the reader's, kept for the slot's next object
        return memoryview(mm)[: reader.layout.object_nbytes], None

    def _arena_seal(self, kb: bytes) -> None:
        self._arena_reader(kb).seal(kb)

    def _arena_state(self, kb: bytes) -> int:
        return self._arena_reader(kb).state(kb)

    # -- the calls ---------------------------------------------------------------------------
    def open(self, key: bytes | str) -> MappedObject:
        """Read a sealed object in place (read-only)."""
        kb, k = parse_key(key)
        if not in_arena(kb):
            return MappedObject.map_file(self.path / k, k, writable=False)
        return MappedObject(k, self._arena_view(kb), writable=False)

    def open_writable(self, key: bytes | str) -> MappedObject:
        """Map an unsealed object read-write; raises :class:`ObjectSealed` once sealed."""
        kb, k = parse_key(key)
        if in_arena(kb):
            buf, mm = self._arena_writable(kb)
            return MappedObject(k, buf, writable=True, mm=mm)
        p = self.path / k
        try:
            if file_sealed(p):
                raise ObjectSealed(k)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None
        return MappedObject.map_file(p, k, writable=True)

    def seal(self, key: bytes | str) -> None:
        """Make an object read-only for everyone from now on."""
        kb, k = parse_key(key)
        if in_arena(kb):
            self._arena_seal(kb)
            return
        try:
            os.chmod(self.path / k, 0o400)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None

    def sealed(self, key: bytes | str) -> bool:
        kb, k = parse_key(key)
        if in_arena(kb):
            return self._arena_state(kb) == SEALED
        try:
            return file_sealed(self.path / k)
        except FileNotFoundError:
            raise ObjectNotFound(k) from None

    def exists(self, key: bytes | str) -> bool:
        kb, k = parse_key(key)
        if not in_arena(kb):
            return (self.path / k).exists()
        try:
            self._arena_state(kb)
        except ObjectNotFound:
            return False
        return True

    @property
    def arena_remaps(self) -> int:
        """How many times this client mapped the arena (1, plus one each time it grew)."""
        return 0 if self._reader is None else self._reader.remaps

    @property
    def arena_writable_maps(self) -> int:
        """Read-write slot mappings its arena reader made (each slot once)."""
        return 0 if self._reader is None else self._reader.writable_maps

    def close(self) -> None:
        """Unmap the arena (views still alive keep their pages until they die); a shared
        reader once its last client closes."""
        reader, self._reader = self._reader, None
        if reader is None:
            return
        if self._shared is None or _release_shared(self._shared):
            reader.close()


#: arenas (device, inode) mapped by shared clients in this process: the reader and its clients
_SHARED: dict[tuple[int, int], tuple[ArenaReader, int]] = {}
_SHARED_LOCK = threading.Lock()


def _shared_reader(folder: Path) -> tuple[tuple[int, int], ArenaReader]:
    """This process's read-write reader of ``folder``'s arena, one more client counted."""
    st = os.stat(folder / ARENA_NAME)
    ident = (st.st_dev, st.st_ino)
    with _SHARED_LOCK:
        reader, clients = _SHARED.get(ident) or (ArenaReader(folder, writable=True), 0)
        _SHARED[ident] = (reader, clients + 1)
    return ident, reader


def _release_shared(ident: tuple[int, int]) -> bool:
    """One client fewer of a shared reader; True when it was the last (close the reader)."""
    with _SHARED_LOCK:
        reader, clients = _SHARED[ident]
        if clients > 1:
            _SHARED[ident] = (reader, clients - 1)
            return False
        del _SHARED[ident]
        return True
