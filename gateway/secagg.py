"""Jobs of masked vectors (secure aggregation, :mod:`core.secagg`) at the gateway.

A job whose initial model is one of ``U32`` tensors (:attr:`core.wire.ModelSpec.masked`), with
its parameters in the weights' ``__metadata__["fedfaas.secagg"]`` (:class:`SecAggConfig`), takes
its clients' masked uint32 vectors: they are decoded into the store as they are and folded by
the aggregators in Z_2^32 (TASKs carry ``FLAG_MASKED``, ``functions/aggregator/worker.py``);
the root unmasks the round's masked sum with the shares the control plane sends and publishes
the dequantized FedAvg (:mod:`gateway.unmask`), served as one float32 tensor
(:func:`served_spec`). So such a job refuses at creation what reads individual updates or the
model as floats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from core import wire
from core.secagg.config import (
    LAYOUT_KEY,
    METADATA_KEY,
    SecAggConfig,
    SecAggConfigError,
    refusals,
)
from gateway.errors import GatewayError
from gateway.meta import declared_spec, wire_metadata

# METADATA_KEY: the parameters' entry; LAYOUT_KEY: the float model's layout (opaque here),
# served with every model so that a client rebuilds its tensors
#: the one float32 tensor a masked job serves: the unmasked, dequantized FedAvg (round 0: the
#: initial model the SDK laid into the masked vector's words)
SERVED_TENSOR = "fedavg"
CODE = "bad_secure_aggregation"

#: what a masked job refuses besides :data:`core.secagg.config.INCOMPATIBLE`, and why
MASKED_SUM_ONLY = {
    "server_opt": "a server optimizer would step from the masked sum, which only the round's "
    "coordinator can unmask",
    "evaluator": "an evaluator would score the masked sum, which is no model",
}


def check_masked_job(spec: wire.ModelSpec, options: dict[str, Any]) -> None:
    """Raise a 400 :class:`GatewayError` (``bad_secure_aggregation``) naming each of
    ``options`` (``aggregation``, ``fedbuff``, ``server_opt``, ``evaluator``: what the initial
    weights declare, ``None`` when unset) that a job of masked vectors cannot run with."""
    if not spec.masked:
        return
    why = refusals(options) + [
        f"{name}: {reason}"
        for name, reason in MASKED_SUM_ONLY.items()
        if options.get(name) is not None
    ]
    if why:
        raise GatewayError(
            f"a job of masked vectors ({wire.MASKED_DTYPE} tensors, secure aggregation) "
            f"cannot use {'; '.join(why)}",
            code=CODE,
        )


def declared_secagg(
    body: bytes | memoryview,
    max_header: int,
    spec: wire.ModelSpec,
    goal: int,
    options: dict[str, Any],
) -> SecAggConfig | None:
    """The job's secure-aggregation parameters (``__metadata__["fedfaas.secagg"]``), or None
    for a job without. A 400 (``bad_secure_aggregation``) saying what is wrong when they do not
    parse, when a masked model comes without them or they come with a float model, when
    ``goal`` clients cannot run a round of them, or when ``options`` cannot
    (:func:`check_masked_job`)."""
    cfg = declared_spec(body, max_header, METADATA_KEY, SecAggConfig.from_spec, CODE)
    if cfg is None and spec.masked:
        raise GatewayError(
            f"a model of {wire.MASKED_DTYPE} tensors is secure aggregation's masked vector: "
            f"declare its parameters in __metadata__[{METADATA_KEY!r}]",
            code=CODE,
        )
    if cfg is None:
        return None
    if not spec.masked:
        raise GatewayError(
            f"__metadata__[{METADATA_KEY!r}] declares secure aggregation, whose updates are "
            f"masked vectors: the model must be of {wire.MASKED_DTYPE} tensors",
            code=CODE,
        )
    try:
        cfg.check_round(goal)
    except SecAggConfigError as exc:
        raise GatewayError(f"__metadata__[{METADATA_KEY!r}]: {exc}", code=CODE) from None
    check_masked_job(spec, options)
    return cfg


@dataclass
class MaskedJob:
    """A job's secure aggregation on a gateway: its parameters, the float model's layout, and
    on the root the rounds waiting to be unmasked (:mod:`gateway.unmask`)."""

    cfg: SecAggConfig
    layout: str | None = None
    #: round -> its :class:`gateway.unmask.Waiting` (typed there: this layer is below it)
    waiting: dict[int, Any] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The journal's record (the job's metadata), read back by :meth:`from_json`."""
        return {"config": self.cfg.to_spec(), "layout": self.layout}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MaskedJob:
        return cls(SecAggConfig.from_spec(data["config"]), data.get("layout"))

    def model_metadata(self) -> dict[str, str]:
        """What every model of the job carries besides its round: the parameters, the layout."""
        out = {METADATA_KEY: json.dumps(self.cfg.to_spec(), sort_keys=True)}
        if self.layout is not None:
            out[LAYOUT_KEY] = self.layout
        return out


def served_spec(spec: wire.ModelSpec) -> wire.ModelSpec:
    """The spec of the model a job serves: ``spec`` itself, or for a masked job one float32
    tensor of its masked vector's length less the weight word (the words lie at the same
    offset in the job's objects: :func:`gateway.unmask.unmasked_model` writes them there)."""
    if not spec.masked:
        return spec
    return wire.ModelSpec.build([(SERVED_TENSOR, "F32", (spec.numel - 1,))])


def masked_job(
    body: bytes | memoryview, max_header: int, cfg: SecAggConfig | None
) -> MaskedJob | None:
    """The gateway's record of a job created with ``cfg`` (from :func:`declared_secagg`), its
    layout from the initial weights' :data:`LAYOUT_KEY` entry as it is; None without ``cfg``."""
    if cfg is None:
        return None
    return MaskedJob(cfg, wire_metadata(body, max_header).get(LAYOUT_KEY))
