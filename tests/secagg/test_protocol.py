"""One SecAgg+ round in process, both sides of core.secagg: the unmasked sum is exactly the sum
of the quantized updates, masked vectors look uniform, dropouts below the threshold are
recovered and past it the round fails with a clear reason."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from core.secagg import keys, masks, quantize
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator, RoundFailed
from core.secagg.messages import Advert, MessageError, context, unmask_from_json, unmask_to_json
from core.secagg.participant import Participant

D = 4000


def _clients(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.2, D).astype(np.float32) for _ in range(n)], [
        int(x) for x in rng.integers(20, 200, n)
    ]


def _run(cfg: SecAggConfig, n: int, drop_after_masking: set[int], drop_before_sharing=()):
    """Stages 1-4 with JSON round trips; returns (result, expected exact sum, masked vectors)."""
    ctx = context("job-a", 3)
    ids = [f"client-{i:02d}" for i in range(n)]
    parts = {c: Participant(cfg, c, ctx) for c in ids}
    server = Coordinator(cfg, ctx)
    for c, p in parts.items():
        server.add_advert(c, Advert.from_json(p.advertise().to_json()))
    roster = server.close_adverts()
    for i, c in enumerate(ids):
        if i not in drop_before_sharing:
            server.add_envelopes(c, parts[c].share_keys(roster))
    ups, ns = _clients(n)
    total = np.zeros(D + 1, np.uint32)
    quantized = np.zeros(D + 1, np.uint32)
    vectors = []
    for i, c in enumerate(ids):
        if i in drop_before_sharing:
            continue
        vec = parts[c].masked_input(ups[i], ns[i], server.inbox(c))
        if i in drop_after_masking:
            continue  # sent nothing after all: dropped before the server got its vector
        vectors.append(vec)
        masks.add(total, vec)
        masks.add(quantized, quantize.quantize(cfg, ups[i], ns[i]))
        server.add_masked(c)
    dropped, survivors = server.unmask_request()
    for c in sorted(survivors):
        s, b = unmask_from_json(unmask_to_json(*parts[c].unmask(dropped, survivors)), n)
        server.add_unmask(c, s, b)
    got = server.unmask(total)
    want = quantize.dequantize(cfg, quantized, len(survivors))
    return got, want, vectors, (ups, ns, survivors)


@pytest.mark.parametrize("neighbours", [None, 6])
def test_round_without_dropouts_is_exact_and_masked_vectors_look_uniform(neighbours) -> None:
    cfg = SecAggConfig(clip=1.0, bits=16, neighbours=neighbours, max_weight=200)
    got, want, vectors, (ups, ns, _) = _run(cfg, 10, set())
    np.testing.assert_array_equal(got, want)
    r = np.array([quantize.weight_ratio(cfg, n) for n in ns])
    fedavg = (r[:, None] * np.clip(np.stack(ups), -1, 1)).sum(0) / r.sum()
    assert np.abs(got - fedavg).max() <= quantize.error_bound(cfg, 10, r.sum() * 0.99)
    for vec in vectors:  # each byte value equally likely: chi-square over 256 bins
        counts = np.bincount(np.frombuffer(vec.tobytes(), np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize("neighbours", [None, 6])
def test_two_of_ten_dropped_after_masking_the_round_is_still_exact(neighbours) -> None:
    cfg = SecAggConfig(neighbours=neighbours, max_weight=200)
    got, want, _, (_, _, survivors) = _run(cfg, 10, {3, 7})
    assert len(survivors) == 8
    np.testing.assert_array_equal(got, want)


def test_a_client_that_never_shared_is_left_out_exactly() -> None:
    got, want, _, (_, _, survivors) = _run(SecAggConfig(), 10, set(), drop_before_sharing={0})
    assert len(survivors) == 9
    np.testing.assert_array_equal(got, want)


def test_past_the_threshold_the_round_fails_and_says_why() -> None:
    # 10 clients, 9 neighbours each, 2/3 -> 6 shares needed: 5 survivors cannot unmask
    with pytest.raises(RoundFailed, match="5 masked vectors arrived, 6 are needed"):
        _run(SecAggConfig(), 10, {0, 1, 2, 3, 4})
    # SecAgg+ with 4 neighbours (3 shares needed): two adjacent dropouts leave someone short
    with pytest.raises(RoundFailed, match="shares arrived, 3 are needed"):
        _run(SecAggConfig(neighbours=4, threshold=0.75), 10, set(range(1, 10, 2)) - {9})


def test_participants_never_unmask_a_client_twice_and_envelopes_are_bound() -> None:
    cfg = SecAggConfig()
    ctx = context("job-b", 1)
    parts = {c: Participant(cfg, c, ctx) for c in ("a", "b", "c", "d")}
    roster = {c: p.advertise() for c, p in parts.items()}
    sent = {c: p.share_keys(roster) for c, p in parts.items()}
    inbox_a = {s: env["a"] for s, env in sent.items() if "a" in env}
    parts["a"].masked_input(np.zeros(10, np.float32), 5, inbox_a)
    with pytest.raises(MessageError, match="both dropped and surviving: b"):
        parts["a"].unmask({"b"}, {"a", "b"})
    # an envelope routed to the wrong receiver does not open
    with pytest.raises(keys.EnvelopeError):
        parts["c"].masked_input(np.zeros(10, np.float32), 5, {"b": sent["b"]["d"]})
