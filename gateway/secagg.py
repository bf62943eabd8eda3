"""Jobs of masked vectors (secure aggregation, :mod:`core.secagg`) at the gateway.

A job whose initial model is one of ``U32`` tensors (:attr:`core.wire.ModelSpec.masked`), with
its parameters in the weights' ``__metadata__["fedfaas.secagg"]`` (:class:`SecAggConfig`), takes
its clients' masked uint32 vectors: they are decoded into the store as they are and folded by
the aggregators in Z_2^32 (TASKs carry ``FLAG_MASKED``, ``functions/aggregator/worker.py``), and
the round's published model is their masked sum, which the holder of the round's
:class:`~core.secagg.coordinator.Coordinator` unmasks. So such a job refuses at creation what
reads individual updates or the model as floats.
"""

from __future__ import annotations

from typing import Any

from core import wire
from core.secagg.config import SecAggConfig, SecAggConfigError, refusals
from gateway.errors import GatewayError
from gateway.meta import declared_spec

#: the initial weights' metadata entry with a job's secure-aggregation parameters
METADATA_KEY = "fedfaas.secagg"
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
