"""The updates a cache function maps in place from its node's store, and their leases.

A round's root gateway lends the round's updates (:mod:`core.objstore.handoff`): a cache
function on that node claims the offer, maps each update it was asked for read-only (a whole
update, or only its part ``s`` of ``S``: a view of that slice, still no copy) and holds one
lease per update until it holds no key of that update any more; then the lease goes back at
once, so the gateway's store frees the object as soon as no function needs it. Updates of the
claim it was not asked for, and that it does not hold already, go back at once too. A gateway
gone (its connection closed) takes its objects with it: they are dropped here at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cache_engine.keys import ObjectKey
from core.objstore import StoreError
from core.objstore.handoff import HandoffClient, HandoffError
from core.wire import HEADER_SIZE, KIND_UPDATE, WireError, read_header
from flstore_workloads.sliced import part_bounds

log = logging.getLogger(__name__)

#: (the gateway's socket, the offer's ticket, the client): one lease of one update
Lease = tuple[str, str, str]


class Lending:
    """Connections to this node's gateways and the leases of what is mapped through them.

    Parameters
    ----------
    lock
        The function's lock over ``objects``.
    objects
        The function's held objects (key -> vector); a gateway gone drops its keys from it.
    """

    def __init__(self, lock: threading.RLock, objects: dict[ObjectKey, Any]) -> None:
        self.lock = lock
        self.objects = objects
        #: connections to gateways' handoff sockets, by path
        self.handoffs: dict[str, HandoffClient] = {}
        #: held keys mapped in place -> their lease
        self.lent: dict[ObjectKey, Lease] = {}
        #: bytes of the update each lease keeps in the store
        self.lease_bytes: dict[Lease, int] = {}

    def client(self, path: str) -> HandoffClient:
        """The one connection to the gateway at ``path`` (made under the lock, so two loads
        at once never open two: a second one's claims would outlive its dropped client)."""
        with self.lock:
            c = self.handoffs.get(path)
            if c is None or c.lost.is_set():
                c = self.handoffs[path] = HandoffClient(path, self._lost)  # a local connect
            return c

    def _lost(self, client: HandoffClient) -> None:
        """A gateway we map objects from went away (its leases with it): drop them all now."""
        with self.lock:
            if self.handoffs.get(str(client.path)) is client:
                del self.handoffs[str(client.path)]
            gone = [k for k, (p, _, _) in self.lent.items() if p == str(client.path)]
            for k in gone:
                self.lease_bytes.pop(self.lent.pop(k), None)
                self.objects.pop(k, None)
        log.warning("gateway handoff %s closed: dropped %d mapped objects", client.path, len(gone))

    def in_use(self, lease: Lease) -> bool:
        """Whether a held key is mapped under ``lease`` (under the lock)."""
        return any(v == lease for v in self.lent.values())

    def map(
        self, keys: Iterable[ObjectKey], offers: Iterable[Mapping[str, str]]
    ) -> dict[ObjectKey, NDArray[np.float32]]:
        """The updates (whole or parts) among ``keys`` that an offer lends, mapped read-only
        in place and recorded under their leases; what this function cannot claim (another
        node's gateway, an offer gone) is left to the cold store."""
        keys = list(keys)
        out: dict[ObjectKey, NDArray[np.float32]] = {}
        for h in offers:
            try:
                client = self.client(h["socket"])
                claim = client.claim(h["ticket"])
            except HandoffError as exc:
                log.info("handoff %s not claimed (%s): MinIO instead", h["socket"], exc)
                continue
            wanted: dict[str, list[ObjectKey]] = {}
            for k in keys:
                if k.kind == "update" and (k.job, k.round) == (claim.job, claim.round):
                    wanted.setdefault(k.client, []).append(k)
            unwanted: list[str] = []
            for name, key in claim.objects.items():
                if name not in claim.held:
                    continue  # given back before: the object may be gone, MinIO has it
                lease = (h["socket"], claim.ticket, name)
                with self.lock:
                    todo = [k for k in wanted.get(name, ()) if k not in self.objects]
                    todo = [k for k in todo if k not in out]
                    if not todo:
                        if not self.in_use(lease):
                            unwanted.append(name)
                        continue
                    try:
                        obj = claim.store.open(key)
                        head = read_header(obj.buf)
                        if head.kind != KIND_UPDATE or head.spec_hash.hex() != claim.spec_hash:
                            raise WireError(f"object {key} is not an update of the job's spec")
                    except (WireError, StoreError, OSError, ValueError) as exc:
                        log.warning("handoff object %s of %s unreadable: %s", key, name, exc)
                        if not self.in_use(lease):
                            unwanted.append(name)
                        continue
                    x = np.frombuffer(obj.buf, np.float32, claim.numel, HEADER_SIZE)
                    for k in todo:  # the buffer is read-only: so are the vectors
                        if k.parts:
                            a, b = part_bounds(claim.numel, k.parts)[k.part]
                            out[k] = x[a:b]
                        else:
                            out[k] = x
                        self.lent[k] = lease
                    self.lease_bytes[lease] = 4 * claim.numel
            if unwanted:  # not wanted here (or unreadable): their leases go back at once
                with contextlib.suppress(HandoffError):
                    client.release(claim.ticket, unwanted)
        return out

    def forget(self, keys: Iterable[ObjectKey]) -> list[Lease]:
        """Drop ``keys`` from the lent ones (under the lock); the leases no held key uses any
        more, to :meth:`give_back` once the lock is released."""
        with self.lock:
            dropped = {self.lent.pop(k) for k in keys if k in self.lent}
            free = sorted(lease for lease in dropped if not self.in_use(lease))
            for lease in free:
                self.lease_bytes.pop(lease, None)
            return free

    def give_back(self, leases: Iterable[Lease]) -> None:
        """Release ``leases`` (one call per gateway and ticket)."""
        by_claim: dict[tuple[str, str], list[str]] = {}
        for path, ticket, name in leases:
            by_claim.setdefault((path, ticket), []).append(name)
        for (path, ticket), names in by_claim.items():
            with self.lock:
                client = self.handoffs.get(path)
            if client is None:
                continue
            try:
                client.release(ticket, names)
            except HandoffError as exc:  # the gateway is gone: its leases went with it
                log.info("handoff release of %d objects on %s: %s", len(names), path, exc)

    def mapped_bytes(self) -> int:
        """Bytes of the distinct updates mapped here (each counted once, whole)."""
        with self.lock:
            return sum(self.lease_bytes.get(lease, 0) for lease in set(self.lent.values()))
