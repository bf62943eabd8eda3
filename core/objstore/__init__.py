"""Per-node, per-job shared-memory object store (one /dev/shm arena file per job + mmap).

See :mod:`core.objstore.store` for the layout and the owner's side,
:mod:`core.objstore.client` for the functions' side, :mod:`core.objstore.arena` for the
one file a job's objects live in, and
:mod:`core.objstore.root` for the default root and the check that it is private.
"""

from core.objstore.client import KEY_BYTES, MappedObject, StoreClient, key_hex
from core.objstore.errors import (
    ObjectNotFound,
    ObjectSealed,
    StoreError,
    StoreFull,
    UnsafeStoreRoot,
)
from core.objstore.root import DEFAULT_ROOT, check_root, default_root
from core.objstore.store import Namespace

__all__ = [
    "DEFAULT_ROOT",
    "KEY_BYTES",
    "MappedObject",
    "Namespace",
    "ObjectNotFound",
    "ObjectSealed",
    "StoreClient",
    "StoreError",
    "StoreFull",
    "UnsafeStoreRoot",
    "check_root",
    "default_root",
    "key_hex",
]
