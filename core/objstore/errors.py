"""Errors of the object store: one base class, subclasses carry the facts."""

from __future__ import annotations

import os
import pwd
from pathlib import Path


class StoreError(Exception):
    """Base of object-store errors."""


class ObjectNotFound(StoreError):
    """No object with that key in this namespace."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object {key} in the store")
        self.key = key


class ObjectSealed(StoreError):
    """The object is sealed (read-only); nobody gets a writable map of it any more."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key} is sealed and read-only")
        self.key = key


class StoreFull(StoreError):
    """The namespace holds its maximum number of objects."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"object store namespace is full ({limit} objects)")
        self.limit = limit


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


class UnsafeStoreRoot(StoreError):
    """A store folder exists but is not a private directory of this process's user.

    Another local user who can create, replace or read it could read every model update or
    swap what the aggregators read, so the store refuses it rather than fix it up.

    Attributes
    ----------
    path : the folder.
    reason : what is wrong with it (a symbolic link, not a directory, owner, mode).
    uid, mode : its owner and permission bits (``mode`` is ``None`` for a symbolic link).
    """

    def __init__(
        self, path: Path, reason: str, uid: int | None = None, mode: int | None = None
    ) -> None:
        self.path = path
        self.reason = reason
        self.uid = uid
        self.mode = mode
        facts = ([] if uid is None else [f"owner {_user(uid)}"]) + (
            [] if mode is None else [f"mode {mode:04o}"]
        )
        found = f" ({', '.join(facts)})" if facts else ""
        super().__init__(
            f"object-store folder {path} {reason}{found}; it must be a directory owned by "
            f"{_user(os.geteuid())} with mode 0700. Another local user may have created it to read "
            f"or replace model updates. Remove it if you know it is stale (rm -r {path}), or "
            "choose another root (--shm-root, FEDFAAS_GATEWAY_SHM_ROOT)"
        )
