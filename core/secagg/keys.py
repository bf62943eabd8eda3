"""Key agreement and the sealed envelopes that carry shares through the server.

Every client makes two X25519 key pairs per round: one to seal its shares for its neighbours
(the server routes them but cannot read them) and one whose agreement with a neighbour gives
their pairwise mask seed. The second is derived from a 16-byte seed so that the seed, not the
key, is what gets Shamir-shared (pycryptodome's Shamir takes 16-byte secrets): the top rebuilds
the seed of a dropped client and checks it against the public key that client advertised.
Shared secrets go through HKDF-SHA256; envelopes are ChaCha20-Poly1305 with the sender, the
receiver and the round as associated data, so the server can neither read, alter nor re-route
them.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 16
KEY_BYTES = 32
NONCE_BYTES = 12


class EnvelopeError(ValueError):
    """An envelope that does not open: altered, or not meant for this receiver."""


def new_seed() -> bytes:
    """A fresh random 16-byte seed (the OS's generator)."""
    return os.urandom(SEED_BYTES)


def hkdf(secret: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``secret`` for the purpose ``info`` (no salt: the secrets are uniform)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def private_from_seed(seed: bytes) -> X25519PrivateKey:
    """The mask-agreement private key a 16-byte ``seed`` stands for."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a key seed is {SEED_BYTES} bytes, not {len(seed)}")
    return X25519PrivateKey.from_private_bytes(hkdf(seed, b"fedfaas secagg x25519"))


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of ``key``'s public key."""
    return key.public_key().public_bytes_raw()


def agree(private: X25519PrivateKey, peer_public: bytes, info: bytes) -> bytes:
    """The 32-byte secret ``private`` shares with the holder of ``peer_public``, for ``info``
    (both sides get the same bytes)."""
    if len(peer_public) != KEY_BYTES:
        raise ValueError(f"an X25519 public key is {KEY_BYTES} bytes, not {len(peer_public)}")
    return hkdf(private.exchange(X25519PublicKey.from_public_bytes(peer_public)), info)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """``nonce || ChaCha20-Poly1305(plaintext)`` bound to ``associated``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated)


def open_sealed(key: bytes, envelope: bytes, associated: bytes) -> bytes:
    """The plaintext of :func:`seal`'s ``envelope``; :class:`EnvelopeError` if it was altered
    or sealed for other ``associated`` data."""
    if len(envelope) < NONCE_BYTES + 16:
        raise EnvelopeError("envelope too short")
    try:
        return ChaCha20Poly1305(key).decrypt(
            envelope[:NONCE_BYTES], envelope[NONCE_BYTES:], associated
        )
    except InvalidTag:
        raise EnvelopeError("envelope does not open: altered or not for this receiver") from None
