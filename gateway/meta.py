"""What the gateway records about a job and its rounds for FLStore, beside the models.

- a client's metadata for a round (``X-Client-Meta``: :func:`parse_client_meta`), kept with its
  update in the journal;
- the validation-set evaluator a job declares in its initial weights' safetensors metadata
  (:func:`declared_evaluator`);
- each round's ``meta.json`` (:func:`round_meta_doc`), which the cache engine reads.

Pure functions: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from core import wire
from gateway.errors import GatewayError

T = TypeVar("T")

#: ``X-Client-Meta``: at most this many bytes, entries, and this key shape.
CLIENT_META_MAX_BYTES = 1024
CLIENT_META_MAX_ENTRIES = 16
CLIENT_META_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def parse_client_meta(raw: str) -> dict[str, float | int]:
    """The ``X-Client-Meta`` header: a small JSON object of finite numbers, e.g.
    ``{"loss": 0.41, "duration_s": 1.9}``, kept with the update and written to the round's
    ``meta.json`` as the client's metadata (FLStore's Oort reads ``loss``/``loss_sq_mean`` and
    ``duration_s``). ``n_samples`` is not allowed: it is ``X-Sample-Count``.

    Raises
    ------
    ValueError
        Saying what is wrong (the upload answers 400 ``bad_client_meta``).
    """
    if len(raw.encode()) > CLIENT_META_MAX_BYTES:
        raise ValueError(f"must be at most {CLIENT_META_MAX_BYTES} bytes of JSON")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a finite number")

    try:
        obj = json.loads(raw, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(obj, dict):
        raise ValueError('must be a JSON object such as {"loss": 0.4, "duration_s": 2.5}')
    if len(obj) > CLIENT_META_MAX_ENTRIES:
        raise ValueError(f"has {len(obj)} entries; at most {CLIENT_META_MAX_ENTRIES}")
    for k, v in obj.items():
        if not CLIENT_META_KEY.match(k):
            raise ValueError(f"key {k[:40]!r} must match {CLIENT_META_KEY.pattern}")
        if k == "n_samples":
            raise ValueError("n_samples is the X-Sample-Count header, not client metadata")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"value of {k!r} must be a number, got {type(v).__name__}")
        try:
            finite = math.isfinite(float(v))
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError(f"value of {k!r} must be a finite number")
    return obj


#: The safetensors ``__metadata__`` entry of a job's initial weights that declares its
#: validation-set evaluator for FLStore (see ``cache_engine.evaluators``).
EVALUATOR_KEY = "fedfaas.evaluator"
EVALUATOR_MAX_BYTES = 1024


def declared_spec(
    body: bytes | memoryview,
    max_header: int,
    key: str,
    parse: Callable[[Any], T],
    code: str,
) -> T | None:
    """``parse`` of the JSON in the initial weights' ``__metadata__[key]``, or None when it is
    not there; 400 ``code`` with ``parse``'s message (a ``ValueError``) or the JSON's error."""
    raw = _declared(body, max_header, key)
    if raw is None:
        return None
    try:
        return parse(json.loads(raw))
    except ValueError as exc:  # the spec's own errors and JSON errors alike
        raise GatewayError(f"__metadata__[{key!r}]: {exc}", code=code) from None


def declared_evaluator(body: bytes | memoryview, max_header: int) -> dict[str, Any] | None:
    """The evaluator spec the initial weights declare (``__metadata__["fedfaas.evaluator"]``, a
    small JSON object with a string ``kind``), or None. The gateway writes it into the round
    metadata, where the FLStore cache engine finds it for contribution workloads."""
    raw = _declared(body, max_header, EVALUATOR_KEY)
    if raw is None:
        return None
    try:
        spec = json.loads(raw) if len(raw) <= EVALUATOR_MAX_BYTES else None
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise GatewayError(
            f"__metadata__[{EVALUATOR_KEY!r}] must be a JSON object of at most "
            f'{EVALUATOR_MAX_BYTES} bytes with a string "kind", e.g. {{"kind": "digits-softmax"}}',
            code="bad_evaluator",
        )
    return spec


def _declared(body: bytes | memoryview, max_header: int, key: str) -> str | None:
    """The initial weights' ``__metadata__[key]`` (None when absent); 400 for a bad header."""
    try:
        return wire_metadata(body, max_header).get(key)
    except wire.WireError as exc:
        raise GatewayError(exc.detail, code=exc.code) from None


def wire_metadata(body: bytes | memoryview, max_header: int) -> dict[str, str]:
    """The ``__metadata__`` map of a safetensors body (empty when it has none)."""
    _, start = wire.parse_raw_header(body, max_header)
    meta = json.loads(bytes(body[8:start])).get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}


def round_meta_doc(
    job: str,
    rnd: int,
    version: int,
    count: int,
    weight_sum: float,
    records: dict[str, dict[str, Any]],
    evaluator: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A round's ``meta.json`` from its journaled update ``records`` (client -> record).

    ``clients`` maps each client to its FedAvg weight (in an async job, its staleness weight);
    ``client_meta`` holds each client's own metadata (its ``X-Client-Meta``) plus ``n_samples``
    (and, in an async job, ``base_version``, the model it trained on); ``round_meta`` names the job's
    evaluator when it declared one. FLStore's cold store reads this (``normalize_meta``).
    """
    doc: dict[str, Any] = {
        "job": job,
        "round": rnd,
        "version": version,
        "count": count,
        "weight_sum": weight_sum,
        "clients": {c: r["weight"] for c, r in records.items()},
        "client_meta": {c: _client_meta(r) for c, r in records.items()},
    }
    if evaluator is not None:
        doc["round_meta"] = {"evaluator": evaluator}
    return doc


def _client_meta(record: dict[str, Any]) -> dict[str, Any]:
    out = {**record.get("meta", {}), "n_samples": record.get("samples", record["weight"])}
    if "base" in record:
        out["base_version"] = record["base"]
    return out
