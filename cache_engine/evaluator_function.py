"""The function side of the evaluator contract (``cache_engine.evaluators``): the
``handle(event, context)`` of an OpenFaaS function that scores a job's models on its owner's
validation data.

The cache function POSTs a model as safetensors (the job's tensor names and shapes, float32)
and expects ``{"utility": <number, higher is better>, "metrics": {<name>: <number>}}``; a batch
of models (the metadata ``{"fedfaas.batch": "<k>"}``, each tensor stacked along a new first
dimension) is answered ``{"utilities": [...], "metrics": [...]}``, one entry per model in order.

:func:`classifier_handler` does all of that for a classifier given its forward pass as a
function of numpy arrays. The model may be written in numpy (``functions/evaluator``, the
demo's, needs no PyTorch in its image) or be a PyTorch module
(:func:`torch_logits`; ``tests/platform/mlp_evaluator`` is such a function).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cache_engine.evaluators import BATCH_KEY, MAX_BATCH

#: a classifier's forward pass: ``logits(state, x) -> (n, classes)``, ``state`` the posted
#: tensors by name; ValueError (or KeyError) for tensors that do not fit the model
Logits = Callable[[dict[str, NDArray[Any]], NDArray[Any]], NDArray[Any]]


def batch_size(body: bytes) -> int | None:
    """The number of models a safetensors body carries (its ``fedfaas.batch`` metadata), or
    None for one model; ValueError for a header that does not parse."""
    if len(body) < 8:
        raise ValueError("shorter than a safetensors header")
    n = int.from_bytes(body[:8], "little")
    if n > len(body) - 8 or n > 100 << 20:
        raise ValueError("the header length runs past the body")
    meta = json.loads(body[8 : 8 + n]).get("__metadata__") or {}
    raw = meta.get(BATCH_KEY) if isinstance(meta, dict) else None
    if raw is None:
        return None
    k = int(raw)
    if not 1 <= k <= MAX_BATCH:
        raise ValueError(f"{BATCH_KEY} must be 1..{MAX_BATCH}, not {raw!r}")
    return k


def check_shapes(state: dict[str, NDArray[Any]], shapes: dict[str, tuple[int, ...]]) -> None:
    """ValueError naming what differs unless ``state`` has exactly the tensors ``shapes``
    names, each of its shape (the check PyTorch's strict ``load_state_dict`` makes)."""
    missing = sorted(set(shapes) - set(state))
    unexpected = sorted(set(state) - set(shapes))
    wrong = [
        f"{n} {tuple(state[n].shape)} (the model's is {shapes[n]})"
        for n in sorted(set(shapes) & set(state))
        if tuple(state[n].shape) != shapes[n]
    ]
    problems = [
        f"{what}: {', '.join(names)}"
        for what, names in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
        if names
    ]
    if problems:
        raise ValueError("; ".join(problems))


def _metrics(logits: NDArray[Any], y: NDArray[np.int64]) -> dict[str, float]:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = float(-log_p[np.arange(len(y)), y].mean())
    accuracy = int((logits.argmax(axis=1) == y).sum()) / len(y)
    return {"accuracy": accuracy, "loss": loss, "n": float(len(y))}


def classifier_handler(
    logits: Logits,
    validation: Callable[[], tuple[NDArray[Any], NDArray[np.int64]]],
) -> Callable[[Any, Any], dict[str, Any]]:
    """The ``handle(event, context)`` of an evaluator function for a classifier.

    ``logits(state, x)`` is the model's forward pass for the posted tensors ``state`` (numpy
    arrays by name) on the inputs ``x``; ``validation()`` returns the validation inputs and
    integer labels as numpy arrays (called once). The answer is ``{"utility": accuracy,
    "metrics": {"accuracy", "loss" (mean cross-entropy), "n"}}``, or the batch form (module
    docstring). 400 ``bad_weights`` for a body that is no safetensors or whose tensors do not
    fit the model (what ``logits`` raises as ValueError or KeyError, said back)."""
    cached: list[tuple[NDArray[Any], NDArray[np.int64]]] = []
    lock = threading.Lock()

    def bad(detail: str) -> dict[str, Any]:
        return {
            "statusCode": 400,
            "body": {"error": "bad_weights", "detail": detail[:500]},
            "headers": {"Content-Type": "application/json"},
        }

    def data() -> tuple[NDArray[Any], NDArray[np.int64]]:
        with lock:  # requests run at once: the data is read once
            if not cached:
                cached.append(validation())
        return cached[0]

    def handle(event: Any, context: Any) -> dict[str, Any]:
        from safetensors import SafetensorError
        from safetensors.numpy import load as st_load

        if event.method != "POST" or not event.body:
            return bad("POST a model's weights as safetensors")
        body = bytes(event.body)
        try:
            k = batch_size(body)
            state = st_load(body)
        except (SafetensorError, ValueError) as exc:
            return bad(f"the body is not safetensors: {exc}")
        if k is not None and any(t.ndim == 0 or t.shape[0] != k for t in state.values()):
            return bad(f"a batch of {k} models stacks each tensor along a first dimension of {k}")
        states = [state] if k is None else [{n: t[i] for n, t in state.items()} for i in range(k)]
        x, y = data()
        try:  # one model at a time: the same numbers as one model per request, to the bit
            metrics = [_metrics(logits(s, x), y) for s in states]
        except (ValueError, KeyError) as exc:  # missing, unexpected or mis-shaped tensors
            return bad(f"the weights do not fit the model: {exc}")
        answer: dict[str, Any] = (
            {"utility": metrics[0]["accuracy"], "metrics": metrics[0]}
            if k is None
            else {"utilities": [m["accuracy"] for m in metrics], "metrics": metrics}
        )
        return {
            "statusCode": 200,
            "body": answer,
            "headers": {"Content-Type": "application/json"},
        }

    return handle


def torch_logits(build: Callable[[dict[str, Any]], Any]) -> Logits:
    """:data:`Logits` of a PyTorch module: ``build(state)`` returns a new module for the
    posted tensors (the architecture the job's clients train), into which they are loaded
    strictly. A module is built per thread and tensor layout and reused; PyTorch runs on one
    thread per request (the parallelism is the requests at once and the replicas)."""
    local = threading.local()

    def logits(state: dict[str, NDArray[Any]], x: NDArray[Any]) -> NDArray[Any]:
        import torch

        torch.set_num_threads(1)
        layout = tuple((n, t.shape) for n, t in sorted(state.items()))
        modules: dict[Any, Any] = local.__dict__.setdefault("modules", {})
        if layout not in modules:
            modules.clear()
            modules[layout] = build(state)
        model = modules[layout]
        try:
            model.load_state_dict(
                {n: torch.from_numpy(np.ascontiguousarray(t)) for n, t in state.items()}
            )
        except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
            raise ValueError(str(exc)) from exc
        model.eval()
        with torch.no_grad():
            out: NDArray[Any] = model(torch.from_numpy(x)).numpy()
        return out

    return logits
