"""Jobs of masked vectors (secure aggregation, :mod:`core.secagg`) at the gateway.

A job whose initial model is one of ``U32`` tensors (:attr:`core.wire.ModelSpec.masked`) takes
its clients' masked uint32 vectors: they are decoded into the store as they are and folded by
the aggregators in Z_2^32 (TASKs carry ``FLAG_MASKED``, ``functions/aggregator/worker.py``), and
the round's published model is their masked sum, which the holder of the round's
:class:`~core.secagg.coordinator.Coordinator` unmasks. So such a job refuses at creation what
reads individual updates or the model as floats.
"""

from __future__ import annotations

from typing import Any

from core import wire
from core.secagg.config import refusals
from gateway.errors import GatewayError

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
            code="bad_secure_aggregation",
        )
