"""Where the coordinator keeps job and round state: in memory, or in Redis (survives restarts).

State is plain JSON (never pickle). One Redis key per job: ``<prefix>job:<name>``; records
that are not a job's (the gateways still to be told of a deletion) under ``<prefix>meta:<key>``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class StateStore(ABC):
    """Job state persistence: save, load all, delete; and records that are not a job's."""

    async def wait_up(self) -> None:  # noqa: B027 (a hook: only a remote store waits)
        """Return once the store answers (at once in memory)."""

    @abstractmethod
    async def save(self, name: str, state: dict[str, Any]) -> None: ...

    @abstractmethod
    async def load_all(self) -> dict[str, dict[str, Any]]: ...

    @abstractmethod
    async def delete(self, name: str) -> None: ...

    @abstractmethod
    async def save_record(self, key: str, state: dict[str, Any]) -> None:
        """Keep a record that is not a job's (e.g. ``deletions``) under ``key``."""

    @abstractmethod
    async def load_record(self, key: str) -> dict[str, Any] | None:
        """The record kept under ``key`` (None: none)."""

    @abstractmethod
    async def delete_record(self, key: str) -> None:
        """Forget the record kept under ``key`` (none kept: nothing to do)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, default: nothing to release
        """Release connections."""


class MemoryStore(StateStore):
    """Process-local store (state is lost on restart)."""

    def __init__(self) -> None:
        self._data: dict[str, str] = {}
        self._records: dict[str, str] = {}

    async def save(self, name: str, state: dict[str, Any]) -> None:
        self._data[name] = json.dumps(state)

    async def load_all(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(v) for k, v in self._data.items()}

    async def delete(self, name: str) -> None:
        self._data.pop(name, None)

    async def save_record(self, key: str, state: dict[str, Any]) -> None:
        self._records[key] = json.dumps(state)

    async def load_record(self, key: str) -> dict[str, Any] | None:
        raw = self._records.get(key)
        return None if raw is None else dict(json.loads(raw))

    async def delete_record(self, key: str) -> None:
        self._records.pop(key, None)


class RedisStore(StateStore):
    """Redis-backed store (``redis.asyncio``), logged in as the user in ``credentials_file``."""

    def __init__(
        self, url: str, credentials_file: Path | None, prefix: str = "fedfaas:control:"
    ) -> None:
        from core.secretfiles import async_redis_client

        self._r = async_redis_client(url, credentials_file, decode_responses=True)
        self._prefix = prefix

    async def wait_up(self) -> None:
        """Wait for Redis to listen (:func:`core.redis_wait.wait_for_redis`)."""
        from core.redis_wait import wait_for_redis

        await wait_for_redis(self._r, "control plane")

    async def save(self, name: str, state: dict[str, Any]) -> None:
        await self._r.set(f"{self._prefix}job:{name}", json.dumps(state))

    async def load_all(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        async for key in self._r.scan_iter(match=f"{self._prefix}job:*"):
            raw = await self._r.get(key)
            if raw is not None:
                out[key[len(self._prefix) + 4 :]] = json.loads(raw)
        return out

    async def delete(self, name: str) -> None:
        await self._r.delete(f"{self._prefix}job:{name}")

    async def save_record(self, key: str, state: dict[str, Any]) -> None:
        await self._r.set(f"{self._prefix}meta:{key}", json.dumps(state))

    async def load_record(self, key: str) -> dict[str, Any] | None:
        raw = await self._r.get(f"{self._prefix}meta:{key}")
        return None if raw is None else dict(json.loads(raw))

    async def delete_record(self, key: str) -> None:
        await self._r.delete(f"{self._prefix}meta:{key}")

    async def aclose(self) -> None:
        await self._r.aclose()
