"""The demo's evaluator function (``functions/evaluator``) scores ``client.model``'s models with
its own numpy forward passes, so that its image needs no PyTorch: they must be the PyTorch
modules' to float32 rounding, on the architectures' exact tensors, for random and trained
weights, and give the same accuracy. A PyTorch evaluator (``torch_logits``, as
``tests/platform/mlp_evaluator`` uses it) answers the same contract."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.numpy import load, save

from cache_engine.evaluator_function import classifier_handler, torch_logits
from client.data import load_digits_arrays
from client.model import MODELS, make_model, model_to_bytes
from functions.evaluator.handler import SHAPES, handle, logits


def _event(body: bytes) -> SimpleNamespace:
    return SimpleNamespace(body=body, headers={}, method="POST", path="/")


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_the_shapes_are_the_pytorch_models(arch):
    state = MODELS[arch]().state_dict()
    assert {n: tuple(t.shape) for n, t in state.items()} == SHAPES[arch]


def _trained(arch: str) -> torch.nn.Module:
    """A few full-batch steps on the digits: weights away from their initialisation, so that
    the comparison sees real activations (ReLUs on and off, pooling maxima that differ)."""
    model = make_model(1, arch)
    x, y = load_digits_arrays()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x)), torch.from_numpy(y)
        ).backward()
        opt.step()
    return model


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("trained", [False, True])
def test_numpy_logits_are_the_pytorch_modules(arch, trained):
    model = _trained(arch) if trained else make_model(0, arch)
    x, y = load_digits_arrays()
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = logits(load(model_to_bytes(model)), x)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert (got.argmax(1) == expected.argmax(1)).mean() == 1.0
    if trained:
        assert (got.argmax(1) == y).mean() > 0.3  # a model that learnt something (chance: 0.1)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_numpy_and_pytorch_evaluators_give_the_same_answer(arch):
    from functions.evaluator.handler import _validation

    torch_handle = classifier_handler(torch_logits(lambda state: MODELS[arch]()), _validation)
    body = model_to_bytes(_trained(arch))
    ours, theirs = handle(_event(body), None), torch_handle(_event(body), None)
    assert ours["statusCode"] == theirs["statusCode"] == 200
    assert ours["body"]["utility"] == theirs["body"]["utility"] > 0.3
    assert ours["body"]["metrics"]["loss"] == pytest.approx(
        theirs["body"]["metrics"]["loss"], rel=1e-4
    )


def test_a_pytorch_evaluator_says_what_does_not_fit():
    torch_handle = classifier_handler(
        torch_logits(lambda state: MODELS["softmax"]()), lambda: load_digits_arrays()
    )
    res = torch_handle(_event(save({"weight": np.zeros((10, 64), np.float32)})), None)
    assert res["statusCode"] == 400 and res["body"]["error"] == "bad_weights"
    assert "bias" in res["body"]["detail"]
