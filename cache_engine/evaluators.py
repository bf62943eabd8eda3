"""Validation-set evaluators named by a job's metadata, built where a workload needs one.

A job declares its evaluator in round 0's ``round_meta["evaluator"]`` (a small JSON spec, never
code). Kinds:

- ``function``: ``{"kind": "function", "function": "<name>", "parallel": 4}``: an OpenFaaS
  function the job's owner deploys (``faas-cli deploy``; ``digits-evaluator``, in
  ``functions/evaluator``, is the demo's, and the example to start from). The cache function sends it a model as safetensors
  (the job's tensors, names and shapes as the clients upload them) with the function token, and
  it answers ``{"utility": u, "metrics": {"loss": ..., "accuracy": ..., ...}}`` computed on the
  owner's validation data; up to ``parallel`` models are evaluated at once
  (:meth:`FunctionEvaluator.map`), over kept-alive connections.
- ``digits-softmax``: softmax regression (``bias`` (10), ``weight`` (10 x 64), sorted-name order)
  on the held-out part of scikit-learn's bundled ``load_digits`` (no download); utility =
  accuracy. In process: a fixture for tests and benchmarks of the workloads themselves.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: a job's tensors in the flat vectors' order: ``((name, shape), ...)``, sorted by name
Layout = tuple[tuple[str, tuple[int, ...]], ...]

#: where a cache function reaches the OpenFaaS gateway (the cache engine sets it at deploy)
GATEWAY_ENV = "FEDFAAS_FLSTORE_GATEWAY_URL"
MAX_PARALLEL = 32
#: an OpenFaaS function name (a DNS label): nothing a URL path could climb out of
FUNCTION_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class EvaluatorUnavailable(ValueError):
    """The spec names no evaluator this build knows, or the evaluator cannot answer."""


def digits_split(
    seed: int = 0, val_fraction: float = 0.3
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """``load_digits`` scaled to [0, 1], split into train and validation (deterministic)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_val = int(len(y) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return x[train], y[train].astype(np.int64), x[val], y[val].astype(np.int64)


def layout_of(safetensors: bytes | memoryview) -> Layout:
    """The tensors of a safetensors object, sorted by name (the flat vectors' order)."""
    n = int.from_bytes(bytes(safetensors[:8]), "little")
    header = json.loads(bytes(safetensors[8 : 8 + n]))
    return tuple(
        sorted(
            (k, tuple(int(d) for d in v["shape"])) for k, v in header.items() if k != "__metadata__"
        )
    )


class FunctionEvaluator:
    """A job's evaluator deployed as an OpenFaaS function (see the module).

    Parameters
    ----------
    function
        The function's name (``/function/<name>`` on the gateway).
    layout
        The job's tensors, to turn a flat vector back into safetensors.
    gateway_url
        The OpenFaaS gateway, e.g. ``http://127.0.0.1:8080``.
    token
        The function token (every FedFaaS function requires it): a callable returning it, read
        again on every call (the secret may be rotated).
    parallel
        Models evaluated at once by :meth:`map`.
    """

    def __init__(
        self,
        function: str,
        layout: Layout,
        gateway_url: str,
        token: Callable[[], str],
        *,
        parallel: int = 4,
        timeout_s: float = 120.0,
    ) -> None:
        import httpx

        self.function = function
        self.layout = layout
        self.url = f"{gateway_url.rstrip('/')}/function/{function}"
        self.parallel = parallel
        self.calls = 0
        self._count = threading.Lock()
        self._token = token
        self._http = httpx.Client(
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=parallel, max_connections=parallel),
        )
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix=f"eval-{function}")

    def encode(self, params: NDArray[np.float32]) -> bytes:
        """``params`` (flat, sorted-name order) as the job's safetensors."""
        from safetensors.numpy import save

        sizes = [int(np.prod(s)) for _, s in self.layout]
        if params.ndim != 1 or params.shape[0] != sum(sizes):
            raise EvaluatorUnavailable(
                f"a model of {params.shape} values does not fit the job's tensors "
                f"({sum(sizes)} values in {len(sizes)} tensors)"
            )
        out, off = {}, 0
        for (name, shape), size in zip(self.layout, sizes, strict=True):
            out[name] = np.ascontiguousarray(params[off : off + size], dtype=np.float32).reshape(
                shape
            )
            off += size
        return bytes(save(out))

    def metrics(self, params: NDArray[np.float32]) -> dict[str, float]:
        """The function's answer for ``params``: its ``metrics`` and its ``utility``."""
        import httpx

        try:
            resp = self._http.post(
                self.url,
                content=self.encode(params),
                headers={
                    "Content-Type": "application/octet-stream",
                    "Authorization": f"Bearer {self._token()}",
                },
            )
        except httpx.HTTPError as exc:
            raise EvaluatorUnavailable(
                f"evaluator function {self.function!r} unreachable at {self.url}: {exc!r}"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200:
            raise EvaluatorUnavailable(
                f"evaluator function {self.function!r} answered {resp.status_code}: "
                f"{resp.text[:300]}"
            )
        utility = body.get("utility") if isinstance(body, dict) else None
        metrics = (body.get("metrics") or {}) if isinstance(body, dict) else {}
        if (
            isinstance(utility, bool)
            or not isinstance(utility, int | float)
            or not math.isfinite(utility)
            or not isinstance(metrics, dict)
            or not all(isinstance(v, int | float) for v in metrics.values())
        ):
            raise EvaluatorUnavailable(
                f"evaluator function {self.function!r} must answer "
                '{"utility": <number>, "metrics": {<name>: <number>, ...}}, '
                f"not {json.dumps(body)[:200]}"
            )
        with self._count:
            self.calls += 1
        return {**{str(k): float(v) for k, v in metrics.items()}, "utility": float(utility)}

    def __call__(self, params: NDArray[np.float32]) -> float:
        return self.metrics(params)["utility"]

    def map(self, many: Sequence[NDArray[np.float32]]) -> list[float]:
        """Utilities of ``many`` models, up to ``parallel`` requests at once."""
        return list(self._pool.map(self, many))


def classifier_handler(
    build: Callable[[dict[str, Any]], Any],
    validation: Callable[[], tuple[Any, Any]],
) -> Callable[[Any, Any], dict[str, Any]]:
    """The ``handle(event, context)`` of an evaluator function for a PyTorch classifier.

    ``build(state)`` returns a new module for the state dict ``state`` (the architecture the
    job's clients train; a new one per request, as requests run at once); ``validation()``
    returns the validation inputs and integer labels as tensors (called once). The handler
    loads the posted safetensors into the module and answers ``{"utility": accuracy,
    "metrics": {"accuracy", "loss", "n"}}``; 400 ``bad_weights`` for a body that is no
    safetensors or does not fit the module. ``functions/evaluator/handler.py`` uses it."""
    cached: list[tuple[Any, Any]] = []

    def bad(detail: str) -> dict[str, Any]:
        return {
            "statusCode": 400,
            "body": {"error": "bad_weights", "detail": detail[:500]},
            "headers": {"Content-Type": "application/json"},
        }

    def handle(event: Any, context: Any) -> dict[str, Any]:
        import torch
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        if event.method != "POST" or not event.body:
            return bad("POST a model's weights as safetensors")
        try:
            state = st_load(bytes(event.body))
        except (SafetensorError, ValueError) as exc:
            return bad(f"the body is not safetensors: {exc}")
        model = build(state)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
            return bad(f"the weights do not fit the model: {exc}")
        if not cached:
            cached.append(validation())
        x, y = cached[0]
        model.eval()
        with torch.no_grad():
            logits = model(x)
            loss = float(torch.nn.functional.cross_entropy(logits, y))
            accuracy = int((logits.argmax(dim=1) == y).sum()) / int(y.shape[0])
        return {
            "statusCode": 200,
            "body": {
                "utility": accuracy,
                "metrics": {"accuracy": accuracy, "loss": loss, "n": float(y.shape[0])},
            },
            "headers": {"Content-Type": "application/json"},
        }

    return handle


@lru_cache(maxsize=8)
def _build(spec_json: str, layout: Layout | None) -> Any:
    spec = json.loads(spec_json)
    kind = spec.get("kind")
    if kind == "digits-softmax":
        import torch

        from fedfaas.workloads import TorchEvaluator

        _, _, xv, yv = digits_split(int(spec.get("split_seed", 0)))
        module = torch.nn.Linear(64, 10)
        return TorchEvaluator(module, xv, yv, names=["bias", "weight"])
    if kind == "function":
        return _function(spec, layout)
    raise EvaluatorUnavailable(f"unknown evaluator kind {kind!r}; known: function, digits-softmax")


def _function(spec: dict[str, Any], layout: Layout | None) -> FunctionEvaluator:
    from fedfaas.runtime.function_auth import FunctionToken, token_path

    name, parallel = spec.get("function"), spec.get("parallel", 4)
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise EvaluatorUnavailable(
            "a function evaluator needs 'function': the function's name (a-z, 0-9 and '-', "
            f"as OpenFaaS names functions), not {name!r}"
        )
    if (
        isinstance(parallel, bool)
        or not isinstance(parallel, int)
        or not 1 <= parallel <= MAX_PARALLEL
    ):
        raise EvaluatorUnavailable(f"'parallel' must be an integer in 1..{MAX_PARALLEL}")
    if layout is None:
        raise EvaluatorUnavailable("the job's tensors are not known here yet (no model held)")
    gateway = os.environ.get(GATEWAY_ENV, "")
    if not gateway:
        raise EvaluatorUnavailable(
            f"no OpenFaaS gateway to call {name!r} through ({GATEWAY_ENV} unset)"
        )
    secret = FunctionToken(token_path())
    try:
        secret.load()
    except OSError as exc:
        raise EvaluatorUnavailable(f"no function token to call {name!r} with: {exc}") from None
    return FunctionEvaluator(
        name, layout, gateway, lambda: secret.load().decode(), parallel=parallel
    )


def build_evaluator(spec: dict[str, Any] | None, layout: Layout | None = None) -> Any:
    """The evaluator ``spec`` names (cached per spec and layout), or None without a spec.
    ``layout``: the job's tensors, which a function evaluator needs."""
    if not spec:
        return None
    if not isinstance(spec, dict):
        raise EvaluatorUnavailable("an evaluator spec must be a JSON object")
    return _build(
        json.dumps(spec, sort_keys=True), layout if spec.get("kind") == "function" else None
    )
