"""One SecAgg+ round in process, both sides of core.secagg with JSON round trips of every
stage message; the sum of the masked vectors is folded by the caller's ``fold``."""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save

from client.secure import masked_initial_weights
from core.secagg import masks, quantize
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator
from core.secagg.messages import Advert, context, unmask_from_json, unmask_to_json
from core.secagg.participant import Participant

D = 4000
#: the p-value under which bytes count as not uniform: a uniform vector falls below it once in
#: 10^9 checks (so the suite does not flake), a quantized vector that is not masked scores ~0
UNIFORM_P = 1e-9
Fold = Callable[[list[np.ndarray]], np.ndarray]
Unmask = Callable[[Coordinator, dict[str, dict[str, Any]]], np.ndarray]


def masked_job_body(
    job: str,
    clients: list[str],
    weights: dict[str, np.ndarray],
    spec: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The control plane's body creating ``job``: one round whose goal is every one of
    ``clients``, no overprovisioning, starting from ``weights`` laid out as the masked model of
    secure-aggregation ``spec`` (:func:`client.secure.masked_initial_weights`); ``extra`` adds
    fields."""
    return {
        "job": job,
        "rounds": 1,
        "goal": len(clients),
        "clients": clients,
        "overprovision": 1.0,
        "weights_b64": base64.b64encode(masked_initial_weights(save(weights), spec)).decode(),
        **extra,
    }


def flat_fold(vectors: list[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(vectors[0])
    for vec in vectors:
        masks.add(total, vec)
    return total


@dataclass
class Outcome:
    got: np.ndarray  # the coordinator's dequantized FedAvg
    want: np.ndarray  # the same from the survivors' quantized (unmasked) vectors
    vectors: list[np.ndarray]  # the masked vectors the server received
    updates: list[np.ndarray]
    samples: list[int]
    survivors: set[str]


def run_round(
    cfg: SecAggConfig,
    n: int,
    drop_after_masking: Collection[int] = (),
    drop_before_sharing: Collection[int] = (),
    fold: Fold = flat_fold,
    seed: int = 0,
    tamper: Callable[[dict[str, Any]], None] | None = None,
    unmask: Unmask | None = None,
    job: str = "job-a",
    round_: int = 3,
) -> Outcome:
    """Stages 1-4 for ``n`` clients; clients in ``drop_after_masking`` masked their vector but
    the server never got it, those in ``drop_before_sharing`` advertised only; ``tamper``
    may change the first survivor's unmask message (its JSON) before the server reads it;
    ``unmask`` replaces the in-process unmasking of ``fold``'s total (it gets the server's
    state after stage 3 and each survivor's unmask message, and returns the FedAvg); ``job``
    and ``round_`` make the round's public context."""
    ctx = context(job, round_)
    ids = [f"client-{i:02d}" for i in range(n)]
    parts = {c: Participant(cfg, c, ctx) for c in ids}
    server = Coordinator(cfg, ctx)
    for c, p in parts.items():
        server.add_advert(c, Advert.from_json(p.advertise().to_json()))
    roster = server.close_adverts()
    for i, c in enumerate(ids):
        if i not in drop_before_sharing:
            server.add_envelopes(c, parts[c].share_keys(roster))
    rng = np.random.default_rng(seed)
    ups = [rng.normal(0, 0.2, D).astype(np.float32) for _ in range(n)]
    ns = [int(x) for x in rng.integers(20, 200, n)]
    quantized = np.zeros(D + 1, np.uint32)
    vectors = []
    for i, c in enumerate(ids):
        if i in drop_before_sharing:
            continue
        vec = parts[c].masked_input(ups[i], ns[i], server.inbox(c))
        if i in drop_after_masking:
            continue
        vectors.append(vec)
        masks.add(quantized, quantize.quantize(cfg, ups[i], ns[i]))
        server.add_masked(c)
    dropped, survivors = server.unmask_request()
    total = fold(vectors)
    messages = {}
    for i, c in enumerate(sorted(survivors)):
        message = unmask_to_json(*parts[c].unmask(dropped, survivors))
        if tamper is not None and i == 0:
            tamper(message)
        messages[c] = message
    if unmask is not None:
        got = unmask(server, messages)
    else:
        for c, message in messages.items():
            server.add_unmask(c, *unmask_from_json(message, n))
        got = server.unmask(total)
    want = quantize.dequantize(cfg, quantized, len(survivors))
    return Outcome(got, want, vectors, ups, ns, survivors)


def looks_uniform(data: bytes) -> float:
    """The chi-square p-value of ``data``'s byte counts against the uniform distribution."""
    from scipy import stats

    counts = np.bincount(np.frombuffer(data, np.uint8), minlength=256)
    return float(stats.chisquare(counts).pvalue)
