"""An evaluator function for a model that is not the demo's: an MLP (64 -> 32 -> 10) on the
digits, written from ``functions/evaluator/handler.py`` as its docstring says (the model and
the validation data changed). ``tests/platform/test_one_platform.py`` deploys it with
``fedfaas deploy -f`` on a running platform and scores a job's clients with it."""

from __future__ import annotations

from typing import Any

from cache_engine.evaluators import classifier_handler


def mlp() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def _validation() -> tuple[Any, Any]:
    import torch

    from cache_engine.evaluators import digits_split

    _, _, x, y = digits_split(seed=4)
    return torch.from_numpy(x), torch.from_numpy(y)


handle = classifier_handler(lambda state: mlp(), _validation)
