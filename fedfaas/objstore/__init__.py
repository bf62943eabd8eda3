"""Per-node, per-job shared-memory object store (plain /dev/shm files + mmap).

See :mod:`fedfaas.objstore.store` for the layout and the two sides (owner and client), and
:mod:`fedfaas.objstore.root` for the default root and the check that it is private.
"""

from fedfaas.objstore.errors import (
    ObjectNotFound,
    ObjectSealed,
    StoreError,
    StoreFull,
    UnsafeStoreRoot,
)
from fedfaas.objstore.root import DEFAULT_ROOT, check_root, default_root
from fedfaas.objstore.store import KEY_BYTES, MappedObject, Namespace, StoreClient, key_hex

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
