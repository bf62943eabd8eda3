"""FedBuff's rules alone (``core.fedbuff``): staleness functions, the spec's checks, and
the root's apply step against the update-by-update sum it rewrites."""

from __future__ import annotations

import numpy as np
import pytest

from core.fedbuff import AsyncSpec, AsyncSpecError, apply


def test_staleness_functions_are_fedasyncs() -> None:
    poly = AsyncSpec()
    assert [poly.weight(s) for s in (0, 3, 8)] == pytest.approx([1.0, 0.5, 1 / 3])
    hinge = AsyncSpec(staleness="hinge", a=0.5, b=2)
    assert [hinge.weight(s) for s in (0, 2, 4)] == pytest.approx([1.0, 1.0, 0.5])
    assert AsyncSpec(staleness="constant").weight(10) == 1.0
    with pytest.raises(ValueError):
        poly.weight(-1)


def test_apply_equals_the_sum_over_updates_of_their_weighted_change() -> None:
    rng = np.random.default_rng(0)
    spec = AsyncSpec(eta=0.7)
    models = {v: rng.standard_normal(50).astype(np.float32) for v in (3, 4, 5)}
    ups = [(5, rng.standard_normal(50)), (3, rng.standard_normal(50)), (4, rng.standard_normal(50))]
    ups = [(b, w.astype(np.float32)) for b, w in ups]
    a = [spec.weight(5 - b) for b, _ in ups]
    mean = sum(ai * w.astype(np.float64) for ai, (_, w) in zip(a, ups, strict=True)) / sum(a)
    base_w: dict[int, float] = {}
    for ai, (b, _) in zip(a, ups, strict=True):
        base_w[b] = base_w.get(b, 0.0) + ai
    got = apply(spec, models[5], mean.astype(np.float32), 3, base_w, models)
    want = models[5] + 0.7 / 3 * sum(
        ai * (w.astype(np.float64) - models[b]) for ai, (b, w) in zip(a, ups, strict=True)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(KeyError, match="not kept"):
        apply(spec, models[5], mean.astype(np.float32), 3, {2: 1.0}, models)


@pytest.mark.parametrize(
    "raw",
    [[], {"max_staleness": True}, {"a": float("nan")}, {"b": -1}, {"eta": "1"}, {"x": 1}],
)
def test_bad_specs_say_what_to_change(raw: object) -> None:
    with pytest.raises(AsyncSpecError):
        AsyncSpec.from_json(raw)  # type: ignore[arg-type]


def test_a_spec_round_trips_through_json() -> None:
    spec = AsyncSpec.from_json({"max_staleness": 2, "staleness": "hinge", "a": 1.0, "b": 1})
    assert AsyncSpec.from_json(spec.to_json()) == spec
