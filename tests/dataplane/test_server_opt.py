"""Server optimizers (issue 14, item 5) against Flower's strategies of the same names, on the
same client results, round after round (the state carried between rounds included)."""

from __future__ import annotations

import numpy as np
import pytest

from core import fedavg
from core.server_opt import DEFAULTS, ServerOptError, ServerOptimizer

flwr = pytest.importorskip("flwr")

SHAPES = [(6, 5), (5,)]
CASES = [
    ("fedavgm", {"momentum": 0.9, "eta": 0.7}),
    ("fedavgm", {}),
    ("fedadam", {"eta": 0.05}),
    ("fedyogi", {}),
    ("fedadagrad", {"tau": 1e-3}),
]


def _flower(name: str, hp: dict[str, float], init: list[np.ndarray]):  # type: ignore[no-untyped-def]
    from flwr.common import ndarrays_to_parameters
    from flwr.server import strategy

    params = ndarrays_to_parameters(init)
    if name == "fedavgm":
        return strategy.FedAvgM(
            initial_parameters=params,
            server_learning_rate=hp.get("eta", 1.0),
            server_momentum=hp.get("momentum", 0.0),
        )
    cls = {"fedadam": strategy.FedAdam, "fedyogi": strategy.FedYogi}.get(name)
    keys = ("eta", "beta_1", "beta_2", "tau") if cls else ("eta", "tau")
    cls = cls or strategy.FedAdagrad
    return cls(initial_parameters=params, **{k: v for k, v in hp.items() if k in keys})


def _fit_results(arrays: list[list[np.ndarray]], weights: list[int]):  # type: ignore[no-untyped-def]
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    return [
        (None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(a), w, {}))
        for a, w in zip(arrays, weights, strict=True)
    ]


@pytest.mark.parametrize(("name", "hp"), CASES)
def test_each_round_equals_flowers_strategy_of_the_same_name(
    name: str, hp: dict[str, float]
) -> None:
    from flwr.common import parameters_to_ndarrays

    rng = np.random.default_rng(7)
    init = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    theirs = _flower(name, hp, init)
    opt = ServerOptimizer.from_json({"name": name, **hp})
    x = np.concatenate([a.ravel() for a in init])
    state: dict[str, np.ndarray] = {}
    for t in range(1, 6):
        clients = [
            [(a + rng.normal(scale=0.3, size=a.shape)).astype(np.float32) for a in init]
            for _ in range(4)
        ]
        weights = [int(w) for w in rng.integers(1, 50, 4)]
        got_flower, _ = theirs.aggregate_fit(t, _fit_results(clients, weights), [])
        want = np.concatenate([a.ravel() for a in parameters_to_ndarrays(got_flower)])
        flat = [np.concatenate([a.ravel() for a in c]) for c in clients]
        avg = fedavg.fedavg_reference(flat, weights).astype(np.float32)
        x = opt.step(x, avg, state, t)
        assert x.dtype == np.float32
        assert fedavg.rel_error(x, want) <= 1e-5, (name, t)
        init = parameters_to_ndarrays(got_flower)
    assert set(state) == set(opt.state_names)


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "sgd"},
        {},
        {"name": "fedadam", "eta": 0},
        {"name": "fedadam", "eta": "fast"},
        {"name": "fedadam", "beta_1": 1.0},
        {"name": "fedadam", "momentum": 0.9},
        {"name": "fedyogi", "tau": float("nan")},
    ],
)
def test_a_bad_spec_is_refused_with_what_to_change(bad: dict[str, object]) -> None:
    with pytest.raises(ServerOptError) as e:
        ServerOptimizer.from_json(bad)
    assert str(e.value)


def test_unnamed_hyperparameters_take_flowers_defaults() -> None:
    for name, d in DEFAULTS.items():
        opt = ServerOptimizer.from_json({"name": name})
        assert all(getattr(opt, k) == v for k, v in d.items())
        assert ServerOptimizer.from_json(opt.to_json()) == opt
