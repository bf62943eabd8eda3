"""A job's server optimizer on the root gateway (the rules: :mod:`core.server_opt`).

The top aggregator's result is the round's FedAvg. With a server optimizer, the root, before
it publishes, steps the global model with it: the next model and the optimizer's state
(``m``, ``v``: vectors of the model's size) go into new objects of the job's store, and the
journal's publish record names them all (``key`` and ``opt``), so a restarted root adopts
them as it adopts the model. Nothing the step read is freed before that record is written: a
root that dies in between publishes the round again from the same inputs, to the same model.

The state is checkpointed beside the model in MinIO (``server_opt.safetensors``), from which
a node taking the job over from a dead root, or a job resumed from its last checkpoint, reads
it back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from core import wire
from core.server_opt import (
    METADATA_KEY,
    ServerOptError,
    ServerOptimizer,
    state_from_safetensors,
    state_to_safetensors,
)
from gateway.errors import GatewayError
from gateway.meta import declared_spec

if TYPE_CHECKING:
    from gateway.jobs import Job

__all__ = ["declared", "from_checkpoint", "state_bytes", "step", "write_state"]


def declared(body: bytes | memoryview, max_header: int) -> ServerOptimizer | None:
    """The server optimizer the initial weights name (``__metadata__["core.server_opt"]``),
    or None; 400 ``bad_server_opt`` saying what to change."""
    return declared_spec(
        body, max_header, METADATA_KEY, ServerOptimizer.from_json, "bad_server_opt"
    )


def from_checkpoint(data: bytes, job: Job, round: int) -> dict[str, np.ndarray]:
    """The state of ``job``'s optimizer after ``round`` from its checkpoint; 409
    ``bad_server_opt_state`` when it is not that (another optimizer, round or model size)."""
    try:
        opt, state, rnd = state_from_safetensors(data)
    except ServerOptError as exc:
        raise GatewayError(str(exc), status=409, code="bad_server_opt_state") from None
    n = job.spec.data_nbytes // 4
    if opt != job.server_opt or rnd != round or any(v.shape != (n,) for v in state.values()):
        raise GatewayError(
            f"job {job.name!r}: the server optimizer checkpoint of round {round} is of "
            f"{opt.name} at round {rnd}, not of this job's {job.server_opt} at round {round}",
            status=409,
            code="bad_server_opt_state",
        )
    return state


def write_state(job: Job, state: Mapping[str, np.ndarray], round: int) -> dict[str, bytes]:
    """Write each state vector into a new sealed object of the job's store; their keys."""
    keys: dict[str, bytes] = {}
    for name, vec in state.items():
        o = job.ns.allocate()
        wire.write_header(o.buf, job.spec, kind=wire.KIND_GLOBAL, weight=0, count=0, round=round)
        wire.flat_view(o.buf, job.spec)[:] = vec
        o.close()
        job.ns.seal(o.key)
        keys[name] = o.key_bytes
    return keys


def state_bytes(job: Job, keys: Mapping[str, bytes], round: int) -> bytes:
    """The checkpoint of the state in objects ``keys`` (see :func:`state_to_safetensors`)."""
    assert job.server_opt is not None
    with contextlib.ExitStack() as es:
        state = {
            n: wire.flat_view(es.enter_context(job.ns.open(k)).buf, job.spec)
            for n, k in keys.items()
        }
        return state_to_safetensors(job.server_opt, state, round)


def step(job: Job, avg_key: bytes, round: int) -> tuple[bytes, dict[str, bytes]]:
    """Step ``job``'s global model with its optimizer and the round's FedAvg (object
    ``avg_key``): the keys of the new model and of the new state objects. Frees nothing.
    Blocking (a few passes over the model): run it off the event loop."""
    opt = job.server_opt
    assert opt is not None and job.global_key is not None
    with contextlib.ExitStack() as es:
        x = wire.flat_view(es.enter_context(job.ns.open(job.global_key)).buf, job.spec)
        avg_obj = es.enter_context(job.ns.open(avg_key))
        avg = wire.flat_view(avg_obj.buf, job.spec)
        state = {
            n: wire.flat_view(es.enter_context(job.ns.open(k)).buf, job.spec)
            for n, k in job.opt_keys.items()
        }
        new = opt.step(x, avg, state, round)
        g = job.ns.allocate()
        g.buf[: wire.HEADER_SIZE] = avg_obj.buf[: wire.HEADER_SIZE]  # the round's weight, count
        wire.flat_view(g.buf, job.spec)[:] = new
        g.close()
        job.ns.seal(g.key)
        return g.key_bytes, write_state(job, state, round)
