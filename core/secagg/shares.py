"""Shamir shares of 16-byte seeds, with pycryptodome's ``Crypto.Protocol.SecretSharing``
(GF(2^128)), and their recovery checked against a commitment.

Shares are indexed from 1; any ``t`` of them rebuild the seed, fewer reveal nothing. A share
that was altered rebuilds a different seed: :func:`recover` checks the result against the
owner's commitment (its advertised public key, or the hash of its self-mask seed), leaves
wrong shares out where enough right ones came, and otherwise raises :class:`ShareError`
instead of unmasking with a wrong seed.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping

from Crypto.Protocol.SecretSharing import Shamir

from .keys import SEED_BYTES


class ShareError(ValueError):
    """Too few shares, or shares that do not rebuild the committed seed."""


def split(seed: bytes, needed: int, holders: int) -> list[bytes]:
    """``holders`` shares of ``seed``, any ``needed`` of which rebuild it; share ``i`` (from 0)
    has index ``i + 1``."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a seed is {SEED_BYTES} bytes, not {len(seed)}")
    if not 1 <= needed <= holders:
        raise ValueError(f"needed must be in 1..{holders}, not {needed}")
    if needed == 1:
        return [seed] * holders  # Shamir with a degree-0 polynomial: the seed itself
    return [share for _, share in Shamir.split(needed, holders, seed, False)]


def commit(seed: bytes) -> bytes:
    """SHA-256 of a self-mask seed: what its owner advertises so that :func:`recover` can
    check it (a random 16-byte seed stays hidden behind its hash)."""
    return hashlib.sha256(b"fedfaas secagg seed" + seed).digest()


#: subsets of ``needed`` shares tried when all of them together rebuild a wrong seed
MAX_SUBSETS = 64


def recover(
    shares: Mapping[int, bytes], needed: int, matches: Callable[[bytes], bool], owner: str
) -> bytes:
    """The seed of ``owner`` from ``shares`` (index -> share), checked with ``matches``.

    All shares are combined first; if that rebuilds a seed that does not match (a wrong
    share among them) and more than ``needed`` came, subsets of ``needed`` shares are tried
    (at most :data:`MAX_SUBSETS`), so a few wrong shares among enough right ones still
    recover the seed.

    Raises
    ------
    ShareError
        Fewer than ``needed`` shares, or no subset rebuilds the committed seed (a wrong
        share); the message names ``owner``.
    """
    if len(shares) < needed:
        raise ShareError(f"{owner}: {len(shares)} shares arrived, {needed} are needed")
    if any(len(s) != SEED_BYTES for s in shares.values()):
        raise ShareError(f"{owner}: a share is not {SEED_BYTES} bytes")
    chosen = sorted(shares.items())
    candidates = itertools.chain(
        [chosen], itertools.islice(itertools.combinations(chosen, needed), MAX_SUBSETS)
    )
    for subset in candidates if len(chosen) > needed else [chosen]:
        seed = subset[0][1] if needed == 1 else Shamir.combine(list(subset), False)
        if matches(seed):
            return seed
    raise ShareError(f"{owner}: the shares do not rebuild the committed seed (a wrong share)")
