"""Async mode (FedBuff) on the node gateways (the rules: :mod:`core.fedbuff`).

An async job's rounds are its buffers: round ``R`` takes ``goal`` updates trained on any of
the versions ``R - 1 - max_staleness .. R - 1`` (:meth:`gateway.jobs.Job.check_round`), each
weighted by its staleness (:meth:`gateway.jobs.Job.buffer_of`, written into the update's header, its
frame and its journal record with the ``base`` version it trained on). The hierarchy folds
them as in sync mode. The root then applies the buffer (:func:`step`): it needs the models
the updates trained on, so it keeps the last ``max_staleness`` published models in the
store beside the current one (:attr:`gateway.jobs.Job.history`); the journal's publish
record names them (``history``), so a restarted root adopts them as it adopts the model.

A root that took the job over, or a job resumed from its checkpoint, starts with the current
model only: updates trained on older versions then get 409 ``too_stale`` (the client
downloads the model and trains again).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core import wire
from core.fedbuff import METADATA_KEY, AsyncSpec, apply
from gateway.meta import declared_spec

if TYPE_CHECKING:
    from gateway.jobs import Job

log = logging.getLogger(__name__)

__all__ = ["declared", "step"]


def declared(body: bytes | memoryview, max_header: int) -> AsyncSpec | None:
    """The async spec the initial weights name (``__metadata__["fedfaas.async"]``), or None
    (a sync job); 400 ``bad_async`` saying what to change."""
    return declared_spec(body, max_header, METADATA_KEY, AsyncSpec.from_json, "bad_async")


def step(job: Job, mean_key: bytes, count: int, records: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Apply the buffer whose staleness-weighted mean is object ``mean_key`` (``count``
    updates, journaled as ``records``: client -> record with ``weight`` and ``base``) to the
    current model: the key of the next model, a new object. Frees nothing. Blocking (a few
    passes over the model): run it off the event loop."""
    spec = job.fedbuff
    assert spec is not None and job.global_key is not None
    base_weights: dict[int, float] = {}
    for rec in records.values():
        b = int(rec["base"])
        base_weights[b] = base_weights.get(b, 0.0) + float(rec["weight"])
    models = {**job.history, job.version: job.global_key}
    for b in sorted(set(base_weights) - set(models)):  # refused at upload: not reached
        log.error(
            "job %s: base model v%d not kept; its updates taken as on v%d", job.name, b, job.version
        )
        base_weights[job.version] = base_weights.get(job.version, 0.0) + base_weights.pop(b)
    with contextlib.ExitStack() as es:
        mean_obj = es.enter_context(job.ns.open(mean_key))
        total = wire.read_header(mean_obj.buf).weight
        have = sum(base_weights.values())
        if have > 0 and abs(have - total) > 1e-9 * max(1.0, total):
            # an update journaled but not in the buffer's result (a round closed early): the
            # weights of the bases are the journal's, scaled to the result's total
            log.warning(
                "job %s: %d journaled updates, %d in the buffer; base weights scaled",
                job.name,
                len(records),
                count,
            )
            base_weights = {b: w * total / have for b, w in base_weights.items()}
        views = {
            b: wire.flat_view(es.enter_context(job.ns.open(models[b])).buf, job.spec)
            for b in base_weights
        }
        x = wire.flat_view(es.enter_context(job.ns.open(job.global_key)).buf, job.spec)
        new = apply(spec, x, wire.flat_view(mean_obj.buf, job.spec), count, base_weights, views)
        g = job.ns.allocate()
        g.buf[: wire.HEADER_SIZE] = mean_obj.buf[: wire.HEADER_SIZE]  # the buffer's weight, count
        wire.flat_view(g.buf, job.spec)[:] = new
        g.close()
        job.ns.seal(g.key)
        return g.key_bytes
