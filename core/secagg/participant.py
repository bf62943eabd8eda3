"""A client's side of one SecAgg+ round: advertise, share keys, mask, unmask.

Pure state, no I/O: the SDK (``client``) carries each message over HTTP. A participant never
answers an unmask request that names the same client both dropped and surviving: the shares
of both of its seeds would unmask that client's individual update.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from . import graph, keys, masks, quantize, shares
from .config import SecAggConfig
from .messages import Advert, MessageError, Shares, b64, unb64


class Participant:
    """One client ``me`` in the round of public ``context``.

    Parameters
    ----------
    cfg : the job's parameters.
    me : this client's id.
    context : :func:`core.secagg.messages.context` of the round.
    """

    def __init__(self, cfg: SecAggConfig, me: str, context: bytes) -> None:
        self.cfg, self.me, self.context = cfg, me, context
        self._c_key = X25519PrivateKey.generate()
        self._s_seed = keys.new_seed()
        self._b_seed = keys.new_seed()
        self._roster: dict[str, Advert] = {}
        self._neighbours: list[str] = []
        self._held: dict[str, tuple[int, bytes, bytes]] = {}  # owner -> (index, s, b)
        self._masked_with: set[str] = set()

    def advertise(self) -> Advert:
        """Stage 1: the public keys and the self-seed commitment."""
        s_pk = keys.public_bytes(keys.private_from_seed(self._s_seed))
        return Advert(keys.public_bytes(self._c_key), s_pk, shares.commit(self._b_seed))

    def _envelope_key(self, peer: str) -> bytes:
        return keys.agree(self._c_key, self._roster[peer].c_pk, b"envelope " + self.context)

    def _associated(self, sender: str, receiver: str) -> bytes:
        return b"%s|%s|%s" % (self.context, sender.encode(), receiver.encode())

    def share_keys(self, roster: Mapping[str, Advert]) -> dict[str, bytes]:
        """Stage 2: ``{neighbour: envelope}``, each with that neighbour's shares of both seeds.

        ``roster`` holds the adverts of every client that advertised (this one included, as
        it sent it)."""
        mine = roster.get(self.me)
        if mine is None or mine != self.advertise():
            raise MessageError("the roster does not carry this client's own advert")
        self._roster = dict(roster)
        n = len(roster)
        self.cfg.check_round(n)
        self._neighbours = graph.neighbours(roster, self.cfg.degree(n), self.context)[self.me]
        needed = self.cfg.shares_needed(n)
        s_shares = shares.split(self._s_seed, needed, len(self._neighbours))
        b_shares = shares.split(self._b_seed, needed, len(self._neighbours))
        out = {}
        for i, peer in enumerate(self._neighbours):
            plain = json.dumps({"i": i + 1, "s": b64(s_shares[i]), "b": b64(b_shares[i])})
            out[peer] = keys.seal(
                self._envelope_key(peer), plain.encode(), self._associated(self.me, peer)
            )
        return out

    def masked_input(
        self, update: np.ndarray, n_samples: int, inbox: Mapping[str, bytes]
    ) -> np.ndarray:
        """Stage 3: the masked uint32 vector, after opening ``inbox`` (sender -> envelope, from
        the neighbours that completed stage 2)."""
        for sender, envelope in inbox.items():
            if sender not in self._neighbours:
                raise MessageError(f"{sender} is not a neighbour of {self.me}")
            plain = keys.open_sealed(
                self._envelope_key(sender), envelope, self._associated(sender, self.me)
            )
            body = json.loads(plain)
            self._held[sender] = (
                int(body["i"]),
                unb64(body["s"], "s share", keys.SEED_BYTES),
                unb64(body["b"], "b share", keys.SEED_BYTES),
            )
        vec = quantize.quantize(self.cfg, update, n_samples)
        masks.add(vec, masks.self_mask(self._b_seed, vec.size))
        for peer in sorted(inbox):
            key = masks.pairwise_key(self._s_seed, self._roster[peer].s_pk, self.context)
            masks.add_pairwise(vec, masks.expand(key, vec.size), self.me, peer)
        self._masked_with = set(inbox)
        return vec

    def unmask(self, dropped: set[str], survivors: set[str]) -> tuple[Shares, Shares]:
        """Stage 4: key-seed shares of the ``dropped`` and self-seed shares of the
        ``survivors`` this client holds. Refuses a client in both sets, and a request that does
        not count this client among the survivors."""
        both = dropped & survivors
        if both:
            raise MessageError(f"clients both dropped and surviving: {', '.join(sorted(both))}")
        if self.me not in survivors:
            raise MessageError(f"{self.me} sent its masked vector but is not among the survivors")
        s = {o: (i, sh) for o, (i, sh, _) in self._held.items() if o in dropped}
        b = {o: (i, sh) for o, (i, _, sh) in self._held.items() if o in survivors}
        return s, b
