"""What the fault campaign (:mod:`bench.faults`) uploads and how it checks what came out.

- :class:`Model`: the update layout of a job, ResNet-18's (102 tensors, 44.8 MB: the
  data-plane faults) or a 257 KiB one (FLStore's faults, whose queries load every update);
  each (seed) gives one update, one flat float32 vector viewed as the named tensors.
- :func:`check_rounds`: every round's checkpointed model against the FedAvg of exactly the
  updates the clients got a 202 for (streamed: one update in memory at a time), and the
  round's ``meta.json`` against the acknowledged clients (``lost``, ``double``).
- :func:`gateway_counters`: the node gateways' fault counters (``/metrics``), read before and
  after a job: the evidence that a fault reached the work it names.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

#: the FLStore faults' model: 257 KiB
SMALL = (("w", (256, 256)), ("b", (256,)))
#: a published model is the FedAvg of its round's acknowledged updates within this
MAX_REL_ERR = 1e-6


@dataclass(frozen=True)
class Model:
    """A job's update layout: ``layout`` is ``(name, shape)`` in the model's order."""

    name: str
    layout: tuple[tuple[str, tuple[int, ...]], ...]
    sizes: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(np.prod(s)) for _, s in self.layout))

    @property
    def values(self) -> int:
        return sum(self.sizes)

    @property
    def nbytes(self) -> int:
        return 4 * self.values

    def flat(self, seed: int) -> np.ndarray:
        """The update of ``seed`` as one float32 vector (standard normal)."""
        return np.random.default_rng(seed).standard_normal(self.values, dtype=np.float32)

    def update(self, seed: int) -> dict[str, np.ndarray]:
        """The update of ``seed`` as its named tensors (views of :meth:`flat`)."""
        return self.split(self.flat(seed))

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        out, at = {}, 0
        for (name, shape), n in zip(self.layout, self.sizes, strict=True):
            out[name] = flat[at : at + n].reshape(shape)
            at += n
        return out

    def join(self, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
        """Named tensors (a published model) as one vector in the layout's order."""
        return np.concatenate([np.asarray(tensors[n]).ravel() for n, _ in self.layout])

    def zeros(self) -> dict[str, np.ndarray]:
        return self.split(np.zeros(self.values, np.float32))


def small_model() -> Model:
    return Model("257 KiB", SMALL)


def resnet18_model() -> Model:
    """torchvision ResNet-18's (10 classes) floating-point state dict: 44.8 MB."""
    from bench.harness.round_clients import resnet18_layout

    return Model("ResNet-18", tuple((n, tuple(s)) for n, s in resnet18_layout()))


#: what :func:`check_rounds` reads of round ``r``: ``(meta.json, model tensors)``, or None
#: when it has no checkpoint (yet)
ReadRound = Callable[[int], tuple[dict[str, Any], dict[str, np.ndarray]] | None]


def check_rounds(
    model: Model,
    acked: Mapping[int, Mapping[str, tuple[int, int]]],
    read: ReadRound,
    rounds: int,
    patience: float = 90.0,
) -> dict[str, Any]:
    """Check rounds ``0..rounds`` (see the module): ``lost`` counts acknowledged updates
    missing from a round's ``meta.json``, ``double`` updates counted more than once or
    without an acknowledgement, ``exact`` every model within :data:`MAX_REL_ERR` of the
    FedAvg of the acknowledged ones, ``checkpoints`` every round written (waiting up to
    ``patience`` s per round: a MinIO outage delays them)."""
    lost = double = 0
    worst = 0.0
    wrong: list[int] = []
    missing: list[int] = []
    out: dict[str, Any] = {}
    for rnd in range(rounds + 1):
        deadline = time.monotonic() + patience
        got = read(rnd)
        while got is None and time.monotonic() < deadline:
            time.sleep(0.5)
            got = read(rnd)
        ups = acked.get(rnd, {})
        if got is None:
            missing.append(rnd)
            lost += len(ups)  # acknowledged, in no published model
            out[str(rnd)] = {"checkpoint": False, "acked": len(ups)}
            continue
        if rnd == 0:
            continue
        meta, tensors = got
        counted = dict(meta.get("clients") or {})
        r_lost = len(set(ups) - set(counted))
        r_double = max(0, int(meta.get("count", 0)) - len(set(counted) & set(ups)))
        err = _fedavg_error(model, ups, tensors)
        lost, double, worst = lost + r_lost, double + r_double, max(worst, err)
        if not err <= MAX_REL_ERR:
            wrong.append(rnd)
        out[str(rnd)] = {
            "checkpoint": True,
            "acked": len(ups),
            "counted": int(meta.get("count", 0)),
            "lost": r_lost,
            "double": r_double,
            "max_rel_err": err,
        }
    return {
        "rounds": out,
        "lost": lost,
        "double": double,
        "exact": not wrong,
        "checkpoints": not missing,
        "wrong": wrong,
        "missing": missing,
        "max_rel_err": worst,
    }


def _fedavg_error(
    model: Model, ups: Mapping[str, tuple[int, int]], tensors: Mapping[str, np.ndarray]
) -> float:
    """max |published - FedAvg(acknowledged)| / max |FedAvg| over the whole model (inf for
    a model of other tensors or no acknowledged update)."""
    if not ups or {n for n, _ in model.layout} != set(tensors):
        return float("inf")
    acc = np.zeros(model.values, np.float64)
    total = 0.0
    for seed, weight in ups.values():
        acc += model.flat(seed).astype(np.float64) * weight
        total += weight
    acc /= total
    got = model.join(tensors).astype(np.float64)
    scale = float(np.max(np.abs(acc)))
    return float(np.max(np.abs(got - acc))) / scale if scale else float(np.max(np.abs(got)))


#: the node gateways' counters that show a fault reached work in flight
COUNTERS = (
    "fedfaas_gateway_updates_rejected",
    "fedfaas_gateway_redeliveries",
    "fedfaas_gateway_journal_retries",
    "fedfaas_gateway_partial_retries",
    "fedfaas_gateway_updates_dropped",
    "fedfaas_gateway_rounds_published",
    # fault (k): a slot's accumulator the full store refused (its slot waits; never a client's)
    "fedfaas_gateway_accumulators_refused",
)


def gateway_counters(
    url: str, admin: Mapping[str, str], verify: ssl.SSLContext | bool
) -> dict[str, float]:
    """``name{label=value}`` -> value of :data:`COUNTERS` on the gateway at ``url`` (empty
    when it does not answer; ``verify``: httpx's, the platform's CA over TLS). A gateway whose
    certificate does not verify raises: that is the harness's mistake, not a gateway down."""
    # imported here: the soak's locustfile (``loadtests/platform.py``, whose folder locust
    # puts first on the path) imports this module, and the client's import of the stdlib's
    # ``platform`` would find that file instead
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = httpx.get(f"{url}/metrics", headers=dict(admin), timeout=10, verify=verify)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        if _cert_refused(exc):
            raise
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        if fam.name not in COUNTERS:
            continue
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{fam.name}{{{labels}}}" if labels else fam.name] = float(s.value)
    return out


def _cert_refused(exc: BaseException) -> bool:
    """``exc`` comes of a server certificate this side did not verify."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter grew by (a gateway restarted meanwhile starts again from 0: its
    value after is the growth); only the ones that grew."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        d = v if d < 0 else d
        if d > 0:
            out[k] = d
    return out
