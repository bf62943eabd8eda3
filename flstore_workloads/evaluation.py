"""Model evaluation, and an :class:`~flstore_workloads.data.Evaluator` for a PyTorch module.

:class:`TorchEvaluator` loads a flat float vector into a module by its ``state_dict`` order (the
job's canonical tensor order), with no pickle: each floating-point entry takes the next
``numel`` values. The copy goes into the module's own tensors, so read-only inputs are fine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from .base import Params, invalid
from .data import MetricsEvaluator, Requirements, WorkloadData
from .errors import DataMismatch

if TYPE_CHECKING:
    import torch


def _float_entries(
    module: torch.nn.Module, names: Sequence[str] | None, length: int | None = None
) -> list[tuple[str, torch.Tensor]]:
    """Entries a flat vector covers: ``names``; else every floating-point ``state_dict`` entry, or,
    when ``length`` matches the parameters alone (a spec without buffers such as BatchNorm running
    statistics), only the parameters, in ``state_dict`` order."""
    state = module.state_dict(keep_vars=False)
    if names is None:
        entries = [(k, t) for k, t in state.items() if t.is_floating_point()]
        if length is not None and length != sum(int(t.numel()) for _, t in entries):
            params = {k for k, _ in module.named_parameters()}
            only = [(k, t) for k, t in entries if k in params]
            if length == sum(int(t.numel()) for _, t in only):
                return only
        return entries
    missing = [n for n in names if n not in state]
    if missing:
        raise DataMismatch(f"module has no state_dict entries {missing[:5]}")
    return [(n, state[n]) for n in names]


def flatten_module(
    module: torch.nn.Module, names: Sequence[str] | None = None
) -> NDArray[np.float32]:
    """The module's floating-point ``state_dict`` entries (or ``names``) as one flat float32 vector."""
    parts = [
        t.detach().cpu().reshape(-1).to(dtype=_torch().float32).numpy()
        for _, t in _float_entries(module, names)
    ]
    return (
        np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    )


def load_flat(
    module: torch.nn.Module, params: NDArray[np.floating], names: Sequence[str] | None = None
) -> None:
    """Copy a flat vector into the module's tensors in ``state_dict`` order (inputs never written).

    Without ``names`` the vector covers every floating-point ``state_dict`` entry, or only the
    parameters when its length says so (buffers then keep the module's current values).
    """
    torch = _torch()
    entries = _float_entries(module, names, int(params.shape[0]) if params.ndim == 1 else None)
    total = sum(int(t.numel()) for _, t in entries)
    if params.ndim != 1 or params.shape[0] != total:
        n_params = sum(int(t.numel()) for t in module.parameters())
        raise DataMismatch(
            f"flat vector has shape {params.shape}; the module's floating-point state_dict entries hold"
            f" {total} values ({n_params} in parameters alone): pass names= to pick the entries"
        )
    offset = 0
    with torch.no_grad():
        for _, t in entries:
            n = int(t.numel())
            piece = params[offset : offset + n]
            if t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous():
                np.copyto(t.numpy().reshape(-1), piece, casting="same_kind")  # one copy, no temp
            else:
                src = torch.from_numpy(np.array(piece, dtype=np.float32, copy=True))
                t.copy_(src.view(t.shape).to(dtype=t.dtype, device=t.device))
            offset += n


def _torch() -> Any:
    import torch

    return torch


class TorchEvaluator:
    """Accuracy and mean cross-entropy of a classifier on ``(X, y)``; utility = accuracy.

    Parameters
    ----------
    module : torch.nn.Module
        The architecture; its weights are overwritten by each call.
    x, y : array-like or torch.Tensor
        Validation inputs and integer labels.
    names : sequence of str, optional
        ``state_dict`` entries the flat vector covers, in order (default: all floating-point ones).
    batch_size : int
        Evaluation batch size.
    utility : {"accuracy", "neg_loss"}
        What ``__call__`` returns.

    One evaluation at a time (a lock): the module's weights are shared, and a cache function
    runs queries in several threads (two queries loading weights into one module at once
    scored each other's models).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        x: Any,
        y: Any,
        *,
        names: Sequence[str] | None = None,
        batch_size: int = 1024,
        utility: str = "accuracy",
    ) -> None:
        torch = _torch()
        self.module = module
        self.names = None if names is None else list(names)
        self.x = torch.as_tensor(x, dtype=torch.float32)
        self.y = torch.as_tensor(y, dtype=torch.long)
        self.batch_size = batch_size
        if utility not in ("accuracy", "neg_loss"):
            raise ValueError("utility must be 'accuracy' or 'neg_loss'")
        self.utility = utility
        self.calls = 0
        self._lock = threading.Lock()

    def metrics(self, params: NDArray[np.float32]) -> dict[str, float]:
        """Load ``params`` and return ``{"accuracy", "loss", "n"}`` on the validation set."""
        torch = _torch()
        correct, loss, n = 0, 0.0, int(self.y.shape[0])
        with self._lock, torch.no_grad():
            load_flat(self.module, params, self.names)
            self.module.eval()
            for start in range(0, n, self.batch_size):
                logits = self.module(self.x[start : start + self.batch_size])
                target = self.y[start : start + self.batch_size]
                loss += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(dim=1) == target).sum())
            self.calls += 1
        return {"accuracy": correct / max(n, 1), "loss": loss / max(n, 1), "n": float(n)}

    def __call__(self, params: NDArray[np.float32]) -> float:
        m = self.metrics(params)
        return m["accuracy"] if self.utility == "accuracy" else -m["loss"]


class EvaluateParams(Params):
    round: int = Field(
        ge=0, description="global version (model after that round) or the client's round"
    )
    client: str | None = Field(
        default=None, description="evaluate this client's model; the global if omitted"
    )


def evaluate_requirements(p: EvaluateParams) -> Requirements:
    if p.client is None:
        return Requirements(policy="P1", global_versions=(p.round,), evaluator=True)
    return Requirements(
        policy="P1",
        update_rounds=(p.round,),
        clients=(p.client,),
        global_versions=(p.round - 1,),
        evaluator=True,
    )


def run_evaluate(data: WorkloadData, p: EvaluateParams) -> dict[str, Any]:
    ev = data.require_evaluator()
    if p.client is None:
        params = data.combine([(1.0, data.global_model(p.round))])
    else:
        if p.round < 1:
            raise invalid("evaluate", "round", "a client model exists from round 1 on", p.round)
        params = data.combine(data.weights(p.round, p.client))
    metrics = (
        ev.metrics(params) if isinstance(ev, MetricsEvaluator) else {"utility": float(ev(params))}
    )
    return {
        "round": p.round,
        "model": "global" if p.client is None else p.client,
        "metrics": {k: float(v) for k, v in metrics.items()},
    }
