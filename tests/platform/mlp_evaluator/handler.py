"""An evaluator function for a model that is not the demo's: a PyTorch MLP (64 -> 32 -> 10) on
the digits, written from ``functions/evaluator/handler.py`` as its docstring says (the model,
through ``torch_logits``, and the validation data changed). ``tests/platform/test_one_platform.py``
deploys it with ``fedfaas deploy -f`` on a running platform and scores a job's clients with it."""

from __future__ import annotations

from typing import Any

from cache_engine.evaluator_function import classifier_handler, torch_logits


def mlp() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def _validation() -> tuple[Any, Any]:
    from cache_engine.evaluators import digits_split

    _, _, x, y = digits_split(seed=4)
    return x, y


handle = classifier_handler(torch_logits(lambda state: mlp()), _validation)
