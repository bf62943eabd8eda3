"""The server's side of one SecAgg+ round: collect adverts, route envelopes, know who masked,
then remove the masks from the folded sum and dequantize.

Pure state, no I/O: the gateways and the control plane hold it and carry the messages. The
sum itself is folded elsewhere (eagerly, on the leaf/middle/top path, with
:func:`core.secagg.masks.add`); :meth:`Coordinator.unmask` takes it. Whatever prevents an
exact result (too few survivors, too few shares, a wrong share) raises :class:`RoundFailed`
with a message saying which client and why.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import Any

import numpy as np

from . import graph, keys, masks, quantize, shares
from .config import SecAggConfig
from .messages import (
    Advert,
    MessageError,
    Shares,
    b64,
    envelopes_from_json,
    unmask_from_json,
    unmask_to_json,
)


class RoundFailed(RuntimeError):
    """The round cannot be unmasked; the message says why."""


class Coordinator:
    """The server state of the round of public ``context`` under ``cfg``."""

    def __init__(self, cfg: SecAggConfig, context: bytes) -> None:
        self.cfg, self.context = cfg, context
        self.adverts: dict[str, Advert] = {}
        self.neighbours: dict[str, list[str]] = {}
        self._envelopes: dict[str, dict[str, bytes]] = {}  # sender -> receiver -> envelope
        self.masked: set[str] = set()
        self._unmask: dict[str, tuple[Shares, Shares]] = {}

    @classmethod
    def restore(
        cls,
        cfg: SecAggConfig,
        context: bytes,
        adverts: Mapping[str, Advert],
        shared: Collection[str],
        masked: Collection[str],
    ) -> Coordinator:
        """The server state at stage 4 from what stages 1-3 left: every advert, who shared
        (SecAgg's U2) and whose masked vector the sum holds. The envelopes are not needed
        any more: the node that unmasks (the job's root gateway) starts from here.
        :class:`MessageError` when a client shared or masked without advertising, or masked
        without sharing; :class:`RoundFailed` when too few advertised."""
        coord = cls(cfg, context)
        for client, advert in adverts.items():
            coord.add_advert(client, advert)
        coord.close_adverts()
        strangers = sorted(set(shared) - set(adverts))
        if strangers:
            raise MessageError(f"clients shared without advertising: {', '.join(strangers)}")
        unshared = sorted(set(masked) - set(shared))
        if unshared:
            raise MessageError(
                f"masked vectors of clients that did not share: {', '.join(unshared)}"
            )
        coord._envelopes = {c: {} for c in shared}
        coord.masked = set(masked)
        return coord

    def to_state(self) -> dict[str, Any]:
        """Everything the stages gave this state so far, as plain JSON (base64 bytes):
        :meth:`from_state` makes the same state again (a control plane that restarts mid-round
        keeps its stages in its store)."""
        return {
            "adverts": {c: a.to_json() for c, a in self.adverts.items()},
            "closed": bool(self.neighbours),
            "envelopes": {
                s: {r: b64(e) for r, e in env.items()} for s, env in self._envelopes.items()
            },
            "masked": sorted(self.masked),
            "unmask": {c: unmask_to_json(s, b) for c, (s, b) in self._unmask.items()},
        }

    @classmethod
    def from_state(cls, cfg: SecAggConfig, context: bytes, state: Mapping[str, Any]) -> Coordinator:
        """The state :meth:`to_state` gave, every message checked again as it was when it came
        (:class:`MessageError` or :class:`RoundFailed` for a state that does not hold)."""
        coord = cls(cfg, context)
        try:
            for client, advert in state["adverts"].items():
                coord.add_advert(client, Advert.from_json(advert))
            if state["closed"]:
                coord.close_adverts()
            for sender, env in state["envelopes"].items():
                limit = len(coord.neighbours.get(sender, ()))
                coord.add_envelopes(sender, envelopes_from_json(env, limit))
            for client in state["masked"]:
                coord.add_masked(client)
            for client, message in state["unmask"].items():
                coord.add_unmask(client, *unmask_from_json(message, len(coord.adverts)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise MessageError(f"a stored round state without {exc}") from None
        return coord

    # stage 1
    def add_advert(self, client: str, advert: Advert) -> None:
        if self.neighbours:
            raise MessageError("the advertise stage is closed")
        if client in self.adverts:
            raise MessageError(f"{client} already advertised")
        self.adverts[client] = advert

    def close_adverts(self) -> dict[str, Advert]:
        """End stage 1; the roster every client gets. :class:`RoundFailed` if too few came."""
        n = len(self.adverts)
        try:
            self.cfg.check_round(n)
        except ValueError as exc:
            raise RoundFailed(str(exc)) from None
        self.neighbours = graph.neighbours(self.adverts, self.cfg.degree(n), self.context)
        return dict(self.adverts)

    # stage 2
    def add_envelopes(self, sender: str, envelopes: Mapping[str, bytes]) -> None:
        if sender not in self.neighbours:
            raise MessageError(f"{sender} did not advertise in this round")
        if sender in self._envelopes:
            raise MessageError(f"{sender} already shared its keys")
        if self.masked:
            raise MessageError("the share-keys stage is closed")
        if set(envelopes) != set(self.neighbours[sender]):
            raise MessageError(f"{sender} must send one envelope to each of its neighbours")
        self._envelopes[sender] = dict(envelopes)

    @property
    def shared(self) -> set[str]:
        """Clients that completed stage 2 (SecAgg's U2)."""
        return set(self._envelopes)

    def inbox(self, receiver: str) -> dict[str, bytes]:
        """``{sender: envelope}`` for ``receiver``, from the neighbours that shared."""
        if receiver not in self._envelopes:
            raise MessageError(f"{receiver} did not share its keys in this round")
        return {s: env[receiver] for s, env in self._envelopes.items() if receiver in env}

    # stage 3
    def add_masked(self, client: str) -> None:
        """Record that ``client``'s masked vector was accepted (and folded)."""
        if client not in self._envelopes:
            raise MessageError(f"{client} did not share its keys in this round")
        if client in self.masked:
            raise MessageError(f"{client} already sent its masked vector")
        self.masked.add(client)

    def unmask_request(self) -> tuple[set[str], set[str]]:
        """``(dropped, survivors)``: who shared but sent no vector, who sent one."""
        needed = self.cfg.shares_needed(len(self.adverts))
        if len(self.masked) < needed:
            raise RoundFailed(
                f"{len(self.masked)} masked vectors arrived, {needed} are needed to unmask"
            )
        return self.shared - self.masked, set(self.masked)

    # stage 4
    def add_unmask(self, client: str, s: Shares, b: Shares) -> None:
        if client not in self.masked:
            raise MessageError(f"{client} sent no masked vector in this round")
        if client in self._unmask:
            raise MessageError(f"{client} already sent its shares")
        dropped, survivors = self.unmask_request()
        if set(s) - dropped or set(b) - survivors:
            raise MessageError(f"{client} sent shares of clients not asked for")
        self._unmask[client] = (s, b)

    def can_unmask(self) -> bool:
        """Whether the shares in hand already rebuild every seed :meth:`unmask` needs (each
        checked against its owner's advertised key or commitment, so a wrong share makes this
        False, not a wrong answer): then the survivors who have not answered yet add nothing,
        and the unmask stage need not wait for them."""
        self.unmask_request()
        if len(self._unmask) < self.cfg.shares_needed(len(self.adverts)):
            return False
        try:
            self._seeds()
        except RoundFailed:
            return False
        return True

    def _seeds(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """The dropped clients' key seeds and the survivors' self seeds, rebuilt from the
        shares in hand (:class:`RoundFailed` where one cannot be)."""
        dropped, survivors = self.unmask_request()
        key_seeds = {
            owner: self._recover(owner, 0, partial(_key_of, self.adverts[owner].s_pk))
            for owner in sorted(dropped)
        }
        self_seeds = {
            owner: self._recover(owner, 1, partial(_self_seed_of, self.adverts[owner].b_commit))
            for owner in sorted(survivors)
        }
        return key_seeds, self_seeds

    def _recover(self, owner: str, kind: int, matches: Callable[[bytes], bool]) -> bytes:
        """``owner``'s seed (``kind`` 0: key seed, 1: self seed) from the shares its
        neighbours sent; a share whose index is not its holder's is left out (the holders'
        indices follow ``owner``'s sorted neighbours, as :class:`Participant` dealt them)."""
        holders = self.neighbours[owner]
        got = {}
        for holder, msg in self._unmask.items():
            share = msg[kind].get(owner)
            if share is not None and holder in holders:
                index = holders.index(holder) + 1
                if share[0] == index:
                    got[index] = share[1]
        needed = self.cfg.shares_needed(len(self.adverts))
        try:
            return shares.recover(got, needed, matches, owner)
        except shares.ShareError as exc:
            raise RoundFailed(f"cannot unmask: {exc}") from None

    def unmask(self, total: np.ndarray) -> np.ndarray:
        """The weighted FedAvg (float32) from ``total``, the Z_2^32 sum of the survivors'
        masked vectors: removes the dropped clients' pairwise masks and the survivors' self
        masks, then dequantizes. ``total`` is modified in place."""
        survivors = self.masked
        key_seeds, self_seeds = self._seeds()
        length = total.size
        for owner, seed in key_seeds.items():
            for peer in self.neighbours[owner]:
                if peer in survivors:  # peer added its mask for owner; owner's half never came
                    key = masks.pairwise_key(seed, self.adverts[peer].s_pk, self.context)
                    masks.remove_pairwise(total, masks.expand(key, length), peer, owner)
        for seed in self_seeds.values():
            masks.subtract(total, masks.self_mask(seed, length))
        return quantize.dequantize(self.cfg, total, len(survivors))


def _key_of(public: bytes, seed: bytes) -> bool:
    """Whether ``seed`` is the key seed behind the advertised ``public`` key."""
    return keys.public_bytes(keys.private_from_seed(seed)) == public


def _self_seed_of(commitment: bytes, seed: bytes) -> bool:
    """Whether ``seed`` is the self seed behind the advertised ``commitment``."""
    return shares.commit(seed) == commitment
