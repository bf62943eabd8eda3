"""Validation-set evaluators named by a job's metadata, built where a workload needs one.

A job declares its evaluator in round 0's ``round_meta["evaluator"]`` (a small JSON spec, never
code). Kinds:

- ``function``: ``{"kind": "function", "function": "<name>", "parallel": 4, "batch": 64,
  "replicas": n}``: an OpenFaaS function the job's owner deploys (``faas-cli deploy``;
  ``digits-evaluator``, in ``functions/evaluator``, is the demo's, and the example to start
  from). The cache function sends it a model as safetensors (the job's tensors, names and shapes
  as the clients upload them) with the function token, and it answers ``{"utility": u,
  "metrics": {"loss": ..., "accuracy": ..., ...}}`` computed on the owner's validation data.
  Many models go in one request (:meth:`FunctionEvaluator.map`): up to ``batch`` models (and
  :data:`REQUEST_BYTES`) stacked along a new first dimension of each tensor, the safetensors
  metadata ``{"fedfaas.batch": "<k>"}`` saying so, answered ``{"utilities": [u, ...],
  "metrics": [{...}, ...]}`` (``cache_engine.evaluator_function.classifier_handler`` does
  both); up to ``parallel`` requests
  at once, over kept-alive connections, which the cache engine spreads over ``replicas``
  replicas of the function (default ``min(parallel, cores)``: it scales the function up to that
  when it learns the spec, never down). A function that refuses batches (an older handler's 400)
  gets one model per request from then on, and ``"batch": 1`` asks for that from the start.
- ``digits-softmax``: softmax regression (``bias`` (10), ``weight`` (10 x 64), sorted-name order)
  on the held-out part of scikit-learn's bundled ``load_digits`` (no download); utility =
  accuracy. In process: a fixture for tests and benchmarks of the workloads themselves. With
  ``"head": true`` it scores the first 650 floats of a longer model (the benchmark's
  ResNet-18-sized objects lead with the classifier's tensors; the rest is not scored), and says
  so (``span = (0, 650)``): contribution workloads then build only those 650 floats of each
  sub-model (``flstore_workloads.contribution``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

log = logging.getLogger(__name__)
#: a job's tensors in the flat vectors' order: ``((name, shape), ...)``, sorted by name
Layout = tuple[tuple[str, tuple[int, ...]], ...]

#: where a cache function reaches the OpenFaaS gateway (the cache engine sets it at deploy)
GATEWAY_ENV = "FEDFAAS_FLSTORE_GATEWAY_URL"
MAX_PARALLEL = 32
MAX_BATCH = 1024
#: models in one request unless the spec says otherwise
DEFAULT_BATCH = 64
#: the safetensors metadata key of a request that carries a batch of models
BATCH_KEY = "fedfaas.batch"
#: the most bytes of models one request carries (a batch of ResNet-18s is cut at 64 MiB)
REQUEST_BYTES = 64 << 20
#: an OpenFaaS function name (a DNS label): nothing a URL path could climb out of
FUNCTION_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class EvaluatorUnavailable(ValueError):
    """The spec names no evaluator this build knows, or the evaluator cannot answer."""


class _Refused(EvaluatorUnavailable):
    """The evaluator function answered with an error status."""

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status


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
        Requests at once by :meth:`map`.
    batch
        Models in one request (at most; :data:`REQUEST_BYTES` also bounds it).
    verify
        How an ``https`` gateway is verified (httpx's ``verify``): in a cache function,
        :func:`core.tls.platform_verify` (the platform's CA).
    """

    def __init__(
        self,
        function: str,
        layout: Layout,
        gateway_url: str,
        token: Callable[[], str],
        *,
        parallel: int = 4,
        batch: int = DEFAULT_BATCH,
        timeout_s: float = 120.0,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        import httpx

        self.function = function
        self.layout = layout
        self.url = f"{gateway_url.rstrip('/')}/function/{function}"
        self.parallel = parallel
        self.batch = batch
        #: requests sent, and models evaluated
        self.requests = 0
        self.calls = 0
        self._count = threading.Lock()
        self._token = token
        self._http = httpx.Client(
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=parallel, max_connections=parallel),
            verify=verify,
        )
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix=f"eval-{function}")

    def _tensors(self, params: NDArray[np.float32]) -> dict[str, NDArray[np.float32]]:
        sizes = [int(np.prod(s)) for _, s in self.layout]
        if params.ndim != 1 or params.shape[0] != sum(sizes):
            raise EvaluatorUnavailable(
                f"a model of {params.shape} values does not fit the job's tensors "
                f"({sum(sizes)} values in {len(sizes)} tensors)"
            )
        out, off = {}, 0
        for (name, shape), size in zip(self.layout, sizes, strict=True):
            out[name] = np.asarray(params[off : off + size], dtype=np.float32).reshape(shape)
            off += size
        return out

    def encode(self, params: NDArray[np.float32]) -> bytes:
        """``params`` (flat, sorted-name order) as the job's safetensors."""
        from safetensors.numpy import save

        return bytes(save({k: np.ascontiguousarray(v) for k, v in self._tensors(params).items()}))

    def encode_batch(self, many: Sequence[NDArray[np.float32]]) -> bytes:
        """``many`` models in one safetensors: each tensor stacked along a new first
        dimension, the metadata ``{"fedfaas.batch": "<k>"}``."""
        from safetensors.numpy import save

        each = [self._tensors(p) for p in many]
        stacked = {name: np.stack([t[name] for t in each]) for name, _ in self.layout}
        return bytes(save(stacked, metadata={BATCH_KEY: str(len(many))}))

    def _post(self, body: bytes) -> Any:
        import httpx

        try:
            resp = self._http.post(
                self.url,
                content=body,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Authorization": f"Bearer {self._token()}",
                },
            )
        except httpx.HTTPError as exc:
            raise EvaluatorUnavailable(
                f"evaluator function {self.function!r} unreachable at {self.url}: {exc!r}"
            ) from None
        with self._count:
            self.requests += 1
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.status_code != 200:
            raise _Refused(
                f"evaluator function {self.function!r} answered {resp.status_code}: "
                f"{resp.text[:300]}",
                resp.status_code,
            )
        return answer

    def _checked(self, utility: Any, metrics: Any, answer: Any) -> dict[str, float]:
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
                f"not {json.dumps(answer)[:200]}"
            )
        with self._count:
            self.calls += 1
        return {**{str(k): float(v) for k, v in metrics.items()}, "utility": float(utility)}

    def metrics(self, params: NDArray[np.float32]) -> dict[str, float]:
        """The function's answer for ``params``: its ``metrics`` and its ``utility``."""
        try:
            body = self._post(self.encode(params))
        except _Refused as exc:
            raise EvaluatorUnavailable(str(exc)) from None
        utility = body.get("utility") if isinstance(body, dict) else None
        metrics = (body.get("metrics") or {}) if isinstance(body, dict) else {}
        return self._checked(utility, metrics, body)

    def metrics_batch(self, many: Sequence[NDArray[np.float32]]) -> list[dict[str, float]]:
        """The function's answers for ``many`` models sent in one request (see the module);
        one model per request should the function refuse batches."""
        if self.batch > 1 and len(many) > 1:
            try:
                body = self._post(self.encode_batch(many))
            except _Refused as exc:
                if exc.status != 400:
                    raise EvaluatorUnavailable(str(exc)) from None
                body = None
            utilities = body.get("utilities") if isinstance(body, dict) else None
            metrics = body.get("metrics") if isinstance(body, dict) else None
            if (
                isinstance(utilities, list)
                and isinstance(metrics, list)
                and len(utilities) == len(metrics) == len(many)
            ):
                return [self._checked(u, m, body) for u, m in zip(utilities, metrics, strict=True)]
            log.warning(
                "evaluator function %s does not take batches of models: one per request",
                self.function,
            )
            self.batch = 1
        return [self.metrics(p) for p in many]

    def __call__(self, params: NDArray[np.float32]) -> float:
        return self.metrics(params)["utility"]

    def map(self, many: Sequence[NDArray[np.float32]]) -> list[float]:
        """Utilities of ``many`` models: in batches of up to ``batch`` models (and
        :data:`REQUEST_BYTES`), spread over up to ``parallel`` requests at once."""
        if not many:
            return []
        size = max(1, 4 * int(many[0].shape[0]))
        per = max(1, min(self.batch, REQUEST_BYTES // size))
        n = max(-(-len(many) // per), min(self.parallel, len(many)))
        cuts = [len(many) * i // n for i in range(n + 1)]
        chunks = [list(many[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]
        out: list[float] = []
        for answers in self._pool.map(self.metrics_batch, chunks):
            out += [a["utility"] for a in answers]
        return out


class _Head:
    """An evaluator of the first ``n`` floats of a longer model (``digits-softmax`` with
    ``"head": true``: its tensors ``bias`` and ``weight`` sort before the rest). It scores a
    model cut to them the same (``span``)."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n = inner, n
        #: the coordinates it reads (``flstore_workloads.contribution``)
        self.span = (0, n)

    def metrics(self, params: NDArray[np.float32]) -> dict[str, float]:
        out: dict[str, float] = self.inner.metrics(params[: self.n])
        return out

    def __call__(self, params: NDArray[np.float32]) -> float:
        return float(self.inner(params[: self.n]))


@lru_cache(maxsize=8)
def _build(spec_json: str, layout: Layout | None) -> Any:
    spec = json.loads(spec_json)
    kind = spec.get("kind")
    if kind == "digits-softmax":
        try:
            import torch

            from flstore_workloads import TorchEvaluator
        except ImportError as exc:  # the cache functions' images carry no torch
            raise EvaluatorUnavailable(
                f"the digits-softmax evaluator needs torch, which this build lacks ({exc}); "
                "name a function evaluator instead (kind 'function', e.g. digits-evaluator)"
            ) from exc

        _, _, xv, yv = digits_split(int(spec.get("split_seed", 0)))
        module = torch.nn.Linear(64, 10)
        ev = TorchEvaluator(module, xv, yv, names=["bias", "weight"])
        return _Head(ev, 650) if spec.get("head") else ev
    if kind == "function":
        return _function(spec, layout)
    raise EvaluatorUnavailable(f"unknown evaluator kind {kind!r}; known: function, digits-softmax")


def _bounded(spec: dict[str, Any], field: str, default: int, top: int) -> int:
    v = spec.get(field, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
        raise EvaluatorUnavailable(f"{field!r} must be an integer in 1..{top}")
    return int(v)


def function_spec_problem(spec: dict[str, Any]) -> str | None:
    """What is wrong with a ``function`` evaluator spec (None: nothing)."""
    name = spec.get("function")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        return (
            "a function evaluator needs 'function': the function's name (a-z, 0-9 and '-', "
            f"as OpenFaaS names functions), not {name!r}"
        )
    try:
        _bounded(spec, "parallel", 4, MAX_PARALLEL)
        _bounded(spec, "batch", DEFAULT_BATCH, MAX_BATCH)
        _bounded(spec, "replicas", 1, MAX_PARALLEL)
    except EvaluatorUnavailable as exc:
        return str(exc)
    return None


def evaluator_replicas(spec: dict[str, Any]) -> int:
    """Replicas of a ``function`` evaluator the cache engine scales it up to: the spec's
    ``replicas``, else ``min(parallel, cores of this machine)``."""
    parallel = _bounded(spec, "parallel", 4, MAX_PARALLEL)
    return _bounded(spec, "replicas", min(parallel, os.cpu_count() or 1), MAX_PARALLEL)


def _function(spec: dict[str, Any], layout: Layout | None) -> FunctionEvaluator:
    from core.tls import TlsError, platform_verify
    from runtime.function_auth import FunctionToken, token_path

    problem = function_spec_problem(spec)
    if problem:
        raise EvaluatorUnavailable(problem)
    name = str(spec["function"])
    parallel = _bounded(spec, "parallel", 4, MAX_PARALLEL)
    batch = _bounded(spec, "batch", DEFAULT_BATCH, MAX_BATCH)
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
    try:
        verify = platform_verify()
    except TlsError as exc:
        raise EvaluatorUnavailable(f"cannot verify the gateway to call {name!r}: {exc}") from None
    return FunctionEvaluator(
        name,
        layout,
        gateway,
        lambda: secret.load().decode(),
        parallel=parallel,
        batch=batch,
        verify=verify,
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
