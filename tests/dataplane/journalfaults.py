"""Journal faults made with Redis's own access control: the gateway's Redis user loses the
right to write one key family of a job while everything else goes on, so a fault hits exactly
the operation that writes it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.services import REDIS_USERS

#: the gateway user's key rule as the platform writes it (restored after a fault)
GATEWAY_KEYS = next(r for r in REDIS_USERS["gateway"].split() if r.startswith("~"))


@contextmanager
def writes_refused(redis_url, writable: list[str]) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """While inside, the ``gateway`` user reads every FedFaaS key but writes only keys that
    match one of ``writable`` (globs): a write to any other fails with ``NOPERM``."""
    admin = redis_url.client()
    try:
        rules = ["%R~fedfaas:*", *(f"%RW~{w}" for w in writable)]
        admin.execute_command("ACL", "SETUSER", "gateway", "resetkeys", *rules)
        yield
    finally:
        admin.execute_command("ACL", "SETUSER", "gateway", "resetkeys", GATEWAY_KEYS)
        admin.close()


def publish_refused(redis_url, job: str):  # type: ignore[no-untyped-def]
    """Job ``job``'s publications fail (its state, ``fedfaas:job:<job>:state``, is read-only);
    uploads, slot records, plans and job records go through."""
    return writes_refused(
        redis_url,
        [
            "fedfaas:jobs",
            "fedfaas:job-id",
            f"fedfaas:job:{job}:round:*",
            f"fedfaas:job:{job}:revoked",
        ],
    )


def slot_records_refused(redis_url, job: str):  # type: ignore[no-untyped-def]
    """Job ``job``'s slot records (finished partials, checkpoints) fail to be written; uploads
    (rounds 1 to 9), plans, publications and job records go through."""
    return writes_refused(
        redis_url,
        [
            "fedfaas:jobs",
            "fedfaas:job-id",
            f"fedfaas:job:{job}:state",
            f"fedfaas:job:{job}:revoked",
            f"fedfaas:job:{job}:round:[0-9]",
            f"fedfaas:job:{job}:round:*:plans",
        ],
    )
