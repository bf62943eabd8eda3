"""A cache function frees what a query built (a full collection, the heaps' pages given back)
only after a query over parts or over large models with an evaluator: a collection costs about
0.1 s once torch is loaded, which every answer on a small model (the digits job's leave-one-out,
~10 ms) waited for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cache_engine.keys import ObjectKey
from functions.flstore import handler as h

SMALL = ObjectKey("job", 1, "update", "a")
BIG = ObjectKey("job", 1, "update", "b")
META = ObjectKey("job", 1, "meta")
EVALUATOR = {"kind": "digits-softmax", "split_seed": 0}


@pytest.fixture()
def held(monkeypatch: pytest.MonkeyPatch) -> dict[ObjectKey, Any]:
    objects: dict[ObjectKey, Any] = {
        SMALL: np.zeros(650, np.float32),
        BIG: np.zeros(h.TIDY_BYTES // 4, np.float32),
        META: {"clients": ["a", "b"]},
    }
    monkeypatch.setattr(h, "_objects", objects)
    return objects


def _body(*keys: ObjectKey, **extra: Any) -> dict[str, Any]:
    return {"workload": "leave-one-out", "objects": [k.id for k in keys], **extra}


def test_only_queries_over_parts_or_large_models_with_an_evaluator_tidy(
    held: dict[ObjectKey, Any],
) -> None:
    assert not h._tidies(_body(SMALL, META, evaluator=EVALUATOR))
    assert h._tidies(_body(BIG, META, evaluator=EVALUATOR))
    assert not h._tidies(_body(BIG, META))  # no sub-models built
    assert h._tidies(_body(SMALL, META, slices={"dim": 650, "ranges": []}))
    assert not h._tidies(_body(ObjectKey("job", 1, "update", "zz"), evaluator=EVALUATOR))
    assert not h._tidies({"workload": "x", "objects": "nonsense", "evaluator": EVALUATOR})


def test_the_answer_of_a_small_query_does_not_wait_for_a_collection(
    held: dict[ObjectKey, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    tidied: list[str] = []
    monkeypatch.setattr(h, "release_free_memory", lambda: tidied.append("trim") or True)
    monkeypatch.setattr(h, "_run_query", lambda body: {"statusCode": 200})
    h._run(_body(SMALL, META, evaluator=EVALUATOR))
    assert tidied == []
    h._run(_body(BIG, META, evaluator=EVALUATOR))
    assert tidied == ["trim"]
