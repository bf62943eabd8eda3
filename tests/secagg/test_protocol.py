"""One SecAgg+ round in process, both sides of core.secagg: the unmasked sum is exactly the sum
of the quantized updates, masked vectors look uniform, dropouts below the threshold are
recovered and past it the round fails with a clear reason."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from core.secagg import graph, keys, quantize
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator, RoundFailed
from core.secagg.messages import MessageError, context, unmask_from_json
from core.secagg.participant import Participant
from tests.secagg.rounds import UNIFORM_P, flat_fold, looks_uniform, run_round


@pytest.mark.parametrize("neighbours", [None, 6])
def test_round_without_dropouts_is_exact_and_masked_vectors_look_uniform(
    neighbours: int | None,
) -> None:
    cfg = SecAggConfig(clip=1.0, bits=16, neighbours=neighbours, max_weight=200)
    out = run_round(cfg, 10)
    np.testing.assert_array_equal(out.got, out.want)
    r = np.array([quantize.weight_ratio(cfg, n) for n in out.samples])
    fedavg = (r[:, None] * np.clip(np.stack(out.updates), -1, 1)).sum(0) / r.sum()
    assert np.abs(out.got - fedavg).max() <= quantize.error_bound(cfg, 10, r.sum() * 0.99)
    for vec in out.vectors:  # each byte value equally likely: chi-square over 256 bins
        assert looks_uniform(vec.tobytes()) > UNIFORM_P
    # the check has power: the same update quantized but unmasked is far from uniform
    plain = quantize.quantize(cfg, out.updates[0], out.samples[0])
    assert looks_uniform(plain.tobytes()) < 1e-100


@pytest.mark.parametrize("neighbours", [None, 6])
def test_two_of_ten_dropped_after_masking_the_round_is_still_exact(neighbours: int | None) -> None:
    out = run_round(SecAggConfig(neighbours=neighbours, max_weight=200), 10, {3, 7})
    assert len(out.survivors) == 8
    np.testing.assert_array_equal(out.got, out.want)


def test_a_client_that_never_shared_is_left_out_exactly() -> None:
    out = run_round(SecAggConfig(), 10, drop_before_sharing={0})
    assert len(out.survivors) == 9
    np.testing.assert_array_equal(out.got, out.want)


def test_past_the_threshold_the_round_fails_and_says_why() -> None:
    # 10 clients, 9 neighbours each, 2/3 -> 6 shares needed: 5 survivors cannot unmask
    with pytest.raises(RoundFailed, match="5 masked vectors arrived, 6 are needed"):
        run_round(SecAggConfig(), 10, {0, 1, 2, 3, 4})
    # SecAgg+ with 4 neighbours (3 shares needed): every other client gone leaves each
    # survivor's self seed with too few holders
    with pytest.raises(RoundFailed, match="shares arrived, 3 are needed"):
        run_round(SecAggConfig(neighbours=4, threshold=0.75), 10, set(range(1, 9, 2)))


def test_a_wrong_share_from_a_survivor_is_left_out_or_fails_the_round_never_a_wrong_model() -> None:
    def flip(message: dict[str, Any]) -> None:
        owner, (index, share) = next(iter(message["b"].items()))
        raw = bytearray(base64.b64decode(share))
        raw[0] ^= 1
        message["b"][owner] = [index, base64.b64encode(bytes(raw)).decode()]

    cfg = SecAggConfig(threshold=1.0)  # every holder's share is needed: the flipped one too
    with pytest.raises(RoundFailed, match="do not rebuild the committed seed"):
        run_round(cfg, 5, tamper=flip)
    # below the threshold of 1, the other shares rebuild the seed without the wrong one
    out = run_round(SecAggConfig(), 5, tamper=flip)
    np.testing.assert_array_equal(out.got, out.want)

    def other_index(message: dict[str, Any]) -> None:
        for owner, (index, share) in message["b"].items():
            message["b"][owner] = [index % 4 + 1, share]  # another holder's index

    # a share claiming another holder's index is not taken: the others rebuild the seed
    out = run_round(SecAggConfig(), 5, tamper=other_index)
    np.testing.assert_array_equal(out.got, out.want)


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


@pytest.mark.parametrize("neighbours", [4, 6, None])
def test_a_round_completes_exactly_when_every_seed_keeps_enough_holders(
    neighbours: int | None,
) -> None:
    """Random dropout sets: the round is exact when the survivors are at least ``t`` and each
    seed to rebuild (the dropped clients' key seeds, the survivors' self seeds) has ``t``
    surviving neighbours; otherwise it fails. Never a wrong model."""
    cfg = SecAggConfig(neighbours=neighbours, threshold=0.5)
    rng = np.random.default_rng(7)
    n, t = 10, cfg.shares_needed(10)
    ids = [f"client-{i:02d}" for i in range(n)]
    outcomes: set[bool] = set()
    for _ in range(12):
        dropped = {int(i) for i in rng.choice(n, size=int(rng.integers(0, 6)), replace=False)}
        survivors = {ids[i] for i in range(n) if i not in dropped}
        graph_of = graph.neighbours(ids, cfg.degree(n), context("job-a", 3))
        ok = len(survivors) >= t and all(
            len(set(graph_of[c]) & survivors) >= t for c in ids
        )  # every client's seed is rebuilt: key seeds of the dropped, self seeds of survivors
        if ok:
            out = run_round(cfg, n, dropped, seed=len(outcomes))
            np.testing.assert_array_equal(out.got, out.want)
        else:
            with pytest.raises(RoundFailed):
                run_round(cfg, n, dropped)
        outcomes.add(ok)
    assert outcomes == {True, False}  # both sides of the threshold were drawn


@pytest.mark.parametrize("wrong_share", [False, True])
def test_the_shares_in_hand_can_be_enough_before_every_survivor_answers(wrong_share: bool) -> None:
    # the control plane closes the unmask stage once Coordinator.can_unmask() says the shares
    # rebuild every seed: the survivors who have not answered add nothing, and a wrong share
    # among them makes it wait for more, never unmask wrong
    n = 10
    held: dict[str, np.ndarray] = {}
    answered: list[str] = []

    def fold(vectors: list[np.ndarray]) -> np.ndarray:
        held["total"] = flat_fold(vectors)
        return held["total"]

    def eager(server: Coordinator, messages: dict[str, dict[str, Any]]) -> np.ndarray:
        for client, message in messages.items():
            if server.can_unmask():
                break
            server.add_unmask(client, *unmask_from_json(message, n))
            answered.append(client)
        assert server.can_unmask()
        return server.unmask(held["total"])

    def flip(message: dict[str, Any]) -> None:  # every self-seed share of the first survivor
        for owner, (index, share) in message["b"].items():
            raw = bytearray(base64.b64decode(share))
            raw[0] ^= 1
            message["b"][owner] = [index, base64.b64encode(bytes(raw)).decode()]

    out = run_round(
        SecAggConfig(neighbours=6),
        n,
        drop_after_masking=[3],
        fold=fold,
        unmask=eager,
        tamper=flip if wrong_share else None,
    )
    if not wrong_share:
        assert len(answered) < len(out.survivors), answered  # the rest were not waited for
    else:  # the wrong shares were read, and more right ones waited for
        assert "client-00" in answered and len(answered) > 1
    np.testing.assert_array_equal(out.got, out.want)
