"""digits-evaluator: a job's validation-set evaluator, deployed as an OpenFaaS function.

FLStore's contribution workloads (leave-one-out, Shapley, incentives, evaluate) score models on
the job owner's validation data. The owner deploys that scoring as a function and names it when
creating the job: ``submit_job(..., evaluator={"kind": "function", "function":
"digits-evaluator"})`` (``cache_engine.evaluators``). The cache function then POSTs each model it
needs scored, as safetensors (the job's tensor names and shapes, float32), with the function
token, and expects ``{"utility": <number, higher is better>, "metrics": {<name>: <number>}}``.

This one scores the demo's models (``client.model``: the CNN, or softmax regression, told apart
by their tensors) on the digits held out by ``client.data.federated_digits`` (seed
``DIGITS_SPLIT_SEED``, default 0, 20% of every class): utility = accuracy.

For your own PyTorch classifier, copy this file and change ``_model`` (the architecture your
clients train) and ``_validation`` (your validation inputs and labels, as tensors);
``classifier_handler`` does the rest (another utility than accuracy: write ``handle`` yourself,
keeping the contract above). ``tests/platform/mlp_evaluator`` is such a copy, for an MLP.
"""

from __future__ import annotations

import os
from typing import Any

from cache_engine.evaluators import classifier_handler


def _model(state: dict[str, Any]) -> Any:
    from client.model import MODELS

    return MODELS["cnn" if "conv1.weight" in state else "softmax"]()


def _validation() -> tuple[Any, Any]:
    import numpy as np
    import torch

    from client.data import load_digits_arrays, stratified_test_split

    x, y = load_digits_arrays()
    rng = np.random.default_rng(int(os.environ.get("DIGITS_SPLIT_SEED", "0")))
    _, held_out = stratified_test_split(y, 0.2, rng)
    return torch.from_numpy(x[held_out]), torch.from_numpy(y[held_out])


handle = classifier_handler(_model, _validation)
