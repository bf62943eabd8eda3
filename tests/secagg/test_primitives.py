"""core.secagg's primitives: known answers from the RFCs, quantization bounds, Shamir shares
against pycryptodome, envelopes that refuse tampering, the neighbour graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from core.secagg import graph, keys, masks, quantize, shares
from core.secagg.config import SecAggConfig, SecAggConfigError, refusals


def test_chacha20_mask_expansion_matches_rfc8439_block_function() -> None:
    # RFC 8439 2.3.2: key 00..1f, nonce 000000090000004a00000000, block counter 1
    key = bytes(range(32))
    block0 = masks.expand(key, 32)  # counter 0 with an all-zero nonce: our own mask layout
    assert block0.dtype == np.uint32 and block0.size == 32
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    nonce = (1).to_bytes(4, "little") + bytes.fromhex("000000090000004a00000000")
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(64))
    assert stream.hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    # the mask is the same keystream read as little-endian uint32
    zero_nonce = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    assert block0.tobytes() == zero_nonce.update(bytes(128))
    # and our known answer, pinned: the first words of the mask of key 00..1f
    assert [int(v) for v in block0[:4]] == [2100034873, 1780073945, 1996733837, 1229642936]


def test_x25519_agreement_matches_rfc7748() -> None:
    alice = X25519PrivateKey.from_private_bytes(
        bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    )
    bob = X25519PrivateKey.from_private_bytes(
        bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    )
    assert keys.public_bytes(alice).hex() == (
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    )
    assert keys.public_bytes(bob).hex() == (
        "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    )
    raw = alice.exchange(bob.public_key())
    assert raw.hex() == "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    info = b"test"
    assert keys.agree(alice, keys.public_bytes(bob), info) == keys.agree(
        bob, keys.public_bytes(alice), info
    )
    assert keys.agree(alice, keys.public_bytes(bob), info) == keys.hkdf(raw, info)


def test_pairwise_masks_cancel_in_z_2_32() -> None:
    ctx = b"ctx"
    sa, sb = keys.new_seed(), keys.new_seed()
    pa = keys.public_bytes(keys.private_from_seed(sa))
    pb = keys.public_bytes(keys.private_from_seed(sb))
    ka, kb = masks.pairwise_key(sa, pb, ctx), masks.pairwise_key(sb, pa, ctx)
    assert ka == kb
    m = masks.expand(ka, 1000)
    acc = np.zeros(1000, np.uint32)
    masks.add_pairwise(acc, m, "a", "b")
    assert acc.any()
    masks.add_pairwise(acc, m, "b", "a")
    assert not acc.any()
    masks.add_pairwise(acc, m, "b", "a")
    masks.remove_pairwise(acc, m, "b", "a")
    assert not acc.any()
    with pytest.raises(TypeError):
        masks.add(acc, np.zeros(1000, np.float32))


def test_quantize_round_trip_within_the_bound() -> None:
    cfg = SecAggConfig(clip=0.5, bits=16, max_weight=100)
    rng = np.random.default_rng(0)
    ups = [rng.normal(0, 0.3, 5000).astype(np.float32) for _ in range(7)]
    ns = [10, 100, 250, 3, 50, 77, 100]
    total = np.zeros(5001, np.uint32)
    for u, n in zip(ups, ns, strict=True):
        masks.add(total, quantize.quantize(cfg, u, n))
    got = quantize.dequantize(cfg, total, len(ups))
    r = np.array([quantize.weight_ratio(cfg, n) for n in ns])
    clipped = np.clip(np.stack(ups).astype(np.float64), -0.5, 0.5)
    want = (r[:, None] * clipped).sum(0) / r.sum()
    bound = quantize.error_bound(cfg, len(ups), float(total[-1]) / cfg.levels)
    err = np.abs(got - want).max()
    assert 0 < err <= bound + 1e-6
    with pytest.raises(ValueError, match="NaN"):
        quantize.quantize(cfg, np.array([np.nan]), 1)


def test_shamir_shares_are_pycryptodome_shares_and_any_t_recover() -> None:
    seed = keys.new_seed()
    parts = shares.split(seed, 3, 5)
    assert Shamir.combine([(i + 1, parts[i]) for i in (0, 2, 4)], False) == seed
    ok = lambda s: shares.commit(s) == shares.commit(seed)  # noqa: E731
    assert shares.recover({2: parts[1], 4: parts[3], 5: parts[4]}, 3, ok, "c") == seed
    assert shares.recover({i + 1: p for i, p in enumerate(parts)}, 3, ok, "c") == seed


def test_a_wrong_share_is_rejected_and_too_few_shares_say_so() -> None:
    seed = keys.new_seed()
    parts = shares.split(seed, 3, 5)
    ok = lambda s: shares.commit(s) == shares.commit(seed)  # noqa: E731
    bad = bytes([parts[1][0] ^ 1]) + parts[1][1:]
    with pytest.raises(shares.ShareError, match="c7: the shares do not rebuild"):
        shares.recover({1: parts[0], 2: bad, 3: parts[2]}, 3, ok, "c7")
    # with more right shares than needed, the wrong one is left out
    right = {i + 1: p for i, p in enumerate(parts)}
    assert shares.recover({**right, 2: bad}, 3, ok, "c7") == seed
    with pytest.raises(shares.ShareError, match="c7: 2 shares arrived, 3 are needed"):
        shares.recover({1: parts[0], 2: parts[1]}, 3, ok, "c7")


def test_envelopes_refuse_tampering_and_other_receivers() -> None:
    key = keys.new_seed() * 2
    env = keys.seal(key, b"share", b"ctx|a|b")
    assert keys.open_sealed(key, env, b"ctx|a|b") == b"share"
    with pytest.raises(keys.EnvelopeError):
        keys.open_sealed(key, env, b"ctx|a|c")
    with pytest.raises(keys.EnvelopeError):
        keys.open_sealed(key, env[:-1] + bytes([env[-1] ^ 1]), b"ctx|a|b")


def test_neighbour_graph_is_symmetric_regular_and_public() -> None:
    ids = [f"c{i}" for i in range(10)]
    g = graph.neighbours(ids, 4, b"round-1")
    assert g == graph.neighbours(reversed(ids), 4, b"round-1")
    assert all(len(v) == 4 and c not in v for c, v in g.items())
    assert all(c in g[p] for c, v in g.items() for p in v)
    assert g != graph.neighbours(ids, 4, b"round-2")
    assert graph.neighbours(ids, 9, b"x") == {c: sorted(set(ids) - {c}) for c in ids}


def test_config_checks_name_the_field_and_the_incompatible_options() -> None:
    assert SecAggConfig.from_spec({}).degree(10) == 9
    assert SecAggConfig.from_spec({"neighbours": 4, "threshold": 0.75}).shares_needed(10) == 3
    cases: list[tuple[dict[str, Any], str]] = [
        ({"clip": 0}, "clip"),
        ({"bits": 30}, "bits"),
        ({"neighbours": 3}, "neighbours"),
        ({"threshold": "a"}, "threshold"),
        ({"nope": 1}, "nope"),
    ]
    for spec, field in cases:
        with pytest.raises(SecAggConfigError, match=field):
            SecAggConfig.from_spec(spec)
    with pytest.raises(SecAggConfigError, match="wrap around"):
        SecAggConfig(bits=24).check_round(300)
    assert refusals({"aggregation": None, "server_opt": {"name": "fedadam"}}) == []
    assert refusals({"fedbuff": {}, "drop_flagged": {"workload": "multi-krum"}}) == [
        "fedbuff: FedBuff weights each update by its own staleness",
        "drop_flagged: flagging a client needs FLStore to read its update",
    ]
