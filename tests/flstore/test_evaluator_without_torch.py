"""A cache function's image carries no torch: a job naming the in-process digits-softmax
evaluator gets ``EvaluatorUnavailable`` (the handler's 422 ``no_evaluator``) saying so, not
a ModuleNotFoundError that the handler would answer with a 500."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from cache_engine import evaluators
from cache_engine.evaluators import EvaluatorUnavailable, build_evaluator


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    evaluators._build.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    yield
    evaluators._build.cache_clear()


def test_digits_softmax_without_torch_is_an_unavailable_evaluator(no_torch: None) -> None:
    with pytest.raises(EvaluatorUnavailable, match="needs torch") as err:
        build_evaluator({"kind": "digits-softmax", "split_seed": 3})
    assert "kind 'function'" in str(err.value)


def test_digits_softmax_with_torch_builds() -> None:
    evaluators._build.cache_clear()
    ev = build_evaluator({"kind": "digits-softmax", "split_seed": 3})
    assert ev is not None
