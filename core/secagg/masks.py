"""Masks: uint32 vectors expanded from seeds with ChaCha20, added in Z_2^32.

A mask is the ChaCha20 keystream of a 32-byte key (HKDF of the seed or of the pairwise
secret), read as little-endian uint32: a cryptographic generator, unlike the 32-bit seeded
``RandomState`` of Flower's SecAgg+. Client ``i`` adds ``+p_ij`` for a neighbour ``j`` that
sorts after it and subtracts ``p_ij`` for one before it (no negated copy), so pairwise masks cancel in the sum of both;
numpy's uint32 addition wraps around, which is exactly addition in Z_2^32.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from . import keys

UINT = np.uint32
#: ChaCha20's 16-byte nonce in ``cryptography``: a 4-byte block counter, then 12 bytes
_NONCE = bytes(16)


def expand(key: bytes, length: int) -> np.ndarray:
    """``length`` uint32 values of ChaCha20's keystream for the 32-byte ``key`` (counter 0)."""
    if len(key) != keys.KEY_BYTES:
        raise ValueError(f"a mask key is {keys.KEY_BYTES} bytes, not {len(key)}")
    enc = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    out = np.empty(length, dtype="<u4")
    # into a buffer of our own: update() returns a new bytes object (several times slower)
    enc.update_into(bytes(4 * length), out.data.cast("B"))
    return out.astype(UINT, copy=False)


def self_mask(seed: bytes, length: int) -> np.ndarray:
    """The self mask of a client's 16-byte ``seed``."""
    return expand(keys.hkdf(seed, b"fedfaas secagg self mask"), length)


def pairwise_key(private_seed: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The key of the pairwise mask between the owner of ``private_seed`` and the owner of
    ``peer_public`` (both compute the same one) in one round's ``context``."""
    private = keys.private_from_seed(private_seed)
    return keys.agree(private, peer_public, b"fedfaas secagg pairwise mask " + context)


def add_pairwise(acc: np.ndarray, mask: np.ndarray, me: str, peer: str) -> np.ndarray:
    """Client ``me``'s pairwise mask for ``peer`` into ``acc`` (in place): ``+mask`` if ``me``
    sorts first, else ``-mask``, so the two halves of a pair cancel; returns ``acc``."""
    if me == peer:
        raise ValueError("a client has no pairwise mask with itself")
    return add(acc, mask) if me < peer else subtract(acc, mask)


def remove_pairwise(acc: np.ndarray, mask: np.ndarray, me: str, peer: str) -> np.ndarray:
    """Undo :func:`add_pairwise` (``me`` added its mask for ``peer``, whose half never came)."""
    if me == peer:
        raise ValueError("a client has no pairwise mask with itself")
    return subtract(acc, mask) if me < peer else add(acc, mask)


def add(acc: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """``acc += vec`` in Z_2^32, in place (the eager fold of masked vectors); returns ``acc``."""
    if acc.dtype != UINT or vec.dtype != UINT:
        raise TypeError(f"masked vectors are uint32, not {acc.dtype} and {vec.dtype}")
    np.add(acc, vec, out=acc)
    return acc


def subtract(acc: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """``acc -= vec`` in Z_2^32, in place; returns ``acc``."""
    if acc.dtype != UINT or vec.dtype != UINT:
        raise TypeError(f"masked vectors are uint32, not {acc.dtype} and {vec.dtype}")
    np.subtract(acc, vec, out=acc)
    return acc
