"""Per-node, per-job shared-memory object store (plain /dev/shm files + mmap).

See :mod:`fedfaas.objstore.store` for the layout and the two sides (owner and client).
"""

from fedfaas.objstore.store import (
    DEFAULT_ROOT,
    KEY_BYTES,
    MappedObject,
    Namespace,
    ObjectNotFound,
    ObjectSealed,
    StoreClient,
    StoreError,
    StoreFull,
    key_hex,
)

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
    "key_hex",
]
