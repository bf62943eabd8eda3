"""digits-evaluator: a job's validation-set evaluator, deployed as an OpenFaaS function.

FLStore's contribution workloads (leave-one-out, Shapley, incentives, evaluate) score models on
the job owner's validation data. The owner deploys that scoring as a function and names it when
creating the job: ``submit_job(..., evaluator={"kind": "function", "function":
"digits-evaluator"})`` (``cache_engine.evaluators``). The cache function then POSTs each model it
needs scored, as safetensors (the job's tensor names and shapes, float32), with the function
token, and expects ``{"utility": <number, higher is better>, "metrics": {<name>: <number>}}``.

This one scores the demo's models (``client.model``: the CNN, or softmax regression, told apart
by their tensors) on the digits held out by ``client.data.federated_digits`` (seed
``DIGITS_SPLIT_SEED``, default 0, 20% of every class): utility = accuracy. Their forward passes
are written here in numpy, so the image needs no PyTorch (whose wheels bring CUDA's
libraries: gigabytes); ``tests/flstore/test_digits_evaluator.py`` checks them against
``client.model``'s PyTorch modules.

For your own PyTorch classifier, copy this file and hand ``classifier_handler`` your module
through ``torch_logits`` (``tests/platform/mlp_evaluator`` does: add ``torch`` to your
``requirements.txt``), or write its forward pass in numpy as here; ``_validation`` returns your
validation inputs and labels as numpy arrays. Another utility than accuracy: write ``handle``
yourself, keeping the contract above.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cache_engine.evaluator_function import check_shapes, classifier_handler

#: the demo's architectures (``client.model.MODELS``): tensor name -> shape
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "cnn": {
        "conv1.weight": (16, 1, 3, 3),
        "conv1.bias": (16,),
        "conv2.weight": (32, 16, 3, 3),
        "conv2.bias": (32,),
        "fc1.weight": (64, 512),
        "fc1.bias": (64,),
        "fc2.weight": (10, 64),
        "fc2.bias": (10,),
    },
    "softmax": {"weight": (10, 64), "bias": (10,)},
}


def _conv3x3(x: NDArray[np.float32], w: NDArray[np.float32], b: NDArray[np.float32]) -> Any:
    """``torch.nn.Conv2d(kernel_size=3, padding=1)``: (n, c, h, w) -> (n, o, h, w)."""
    n, c, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * 9)
    out = columns @ w.reshape(w.shape[0], c * 9).T + b
    return out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2)


def _relu(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return np.maximum(x, np.float32(0))


def logits(state: dict[str, NDArray[Any]], x: NDArray[np.float32]) -> NDArray[np.float32]:
    """The demo model's logits for the inputs ``x`` (n, 1, 8, 8): ``client.model.DigitsCNN``
    for the CNN's tensors, ``DigitsSoftmax`` for softmax regression's."""
    arch = "cnn" if "conv1.weight" in state else "softmax"
    check_shapes(state, SHAPES[arch])
    s = {name: np.asarray(t, dtype=np.float32) for name, t in state.items()}
    if arch == "softmax":
        out: NDArray[np.float32] = x.reshape(len(x), -1) @ s["weight"].T + s["bias"]
        return out
    h = _relu(_conv3x3(x, s["conv1.weight"], s["conv1.bias"]))
    h = _relu(_conv3x3(h, s["conv2.weight"], s["conv2.bias"]))
    n, c, rows, cols = h.shape
    h = h.reshape(n, c, rows // 2, 2, cols // 2, 2).max(axis=(3, 5))  # MaxPool2d(2)
    h = _relu(h.reshape(n, -1) @ s["fc1.weight"].T + s["fc1.bias"])
    out = h @ s["fc2.weight"].T + s["fc2.bias"]
    return out


def _validation() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    from client.data import load_digits_arrays, stratified_test_split

    x, y = load_digits_arrays()
    rng = np.random.default_rng(int(os.environ.get("DIGITS_SPLIT_SEED", "0")))
    _, held_out = stratified_test_split(y, 0.2, rng)
    return x[held_out], y[held_out]


handle = classifier_handler(logits, _validation)
