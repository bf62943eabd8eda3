"""Issue 37: every compared row of every benchmark that compares systems is at least 5 runs per
system, the systems alternating, BLAS/OpenMP pinned to one thread. Each benchmark's ``main`` is run with no options up to its
comparison (:func:`bench.harness.compare.run_compare`, replaced here by one that records what it
was asked and stops the run): its default repeats and the systems it alternates."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness import compare
from bench.runinfo import PINNED_THREADS, THREAD_ENV


class _Asked(Exception):
    """Raised by the recording run_compare: the benchmark got as far as its comparison."""


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def record(runners: dict[str, Any], **kw: Any) -> dict[str, Any]:
        env = {k: os.environ.get(k) for k in THREAD_ENV}
        calls.append({"systems": list(runners), "thread_env": env, **kw})
        raise _Asked

    monkeypatch.setattr(compare, "run_compare", record)
    return calls


def _small() -> dict[str, np.ndarray]:
    return {"w": np.zeros(8, np.float32)}


def _robust(monkeypatch: pytest.MonkeyPatch, out: Path) -> Callable[[], int]:
    from bench import robust

    monkeypatch.setattr(robust, "run_compare", compare.run_compare)
    monkeypatch.setattr(robust, "resnet18", _small)
    monkeypatch.setattr(robust, "N", 6)  # 4 of them poisoned
    return lambda: robust.main(["--out", str(out)])


def _main_of(module: str) -> Callable[[pytest.MonkeyPatch, Path], Callable[[], int]]:
    def make(monkeypatch: pytest.MonkeyPatch, out: Path) -> Callable[[], int]:
        import importlib

        mod = importlib.import_module(module)
        args = ["--out", str(out)]
        if module == "bench.scale":
            args += ["--quick"]  # the grid's first point is enough: it stops at its comparison
        return lambda: int(mod.main(args))

    return make


@pytest.mark.parametrize(
    ("bench", "systems"),
    [
        (_main_of("bench.dataplane"), ["FedFaaS", "Flower", "SF"]),
        (_main_of("bench.scale"), ["FedFaaS", "Flower 1.42.0", "Flower 1.32.1 legacy", "SF"]),
        (_main_of("bench.flower_baseline"), ["FedFaaS", "Flower 1.42.0", "Flower 1.32.1 legacy"]),
        (_robust, ["FedFaaS", "Flower 1.42.0", "Flower 1.32.1 legacy"]),
    ],
    ids=["dataplane", "scale", "flower_baseline", "robust"],
)
def test_a_comparing_benchmark_runs_each_system_at_least_5_times_alternating(
    bench: Callable[[pytest.MonkeyPatch, Path], Callable[[], int]],
    systems: list[str],
    asked: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run = bench(monkeypatch, tmp_path)
    with pytest.raises(_Asked):
        run()
    [call] = asked
    assert call["repeats"] >= 5 and compare.REPEATS >= 5
    assert call["systems"] == systems
    # every process of the comparison starts with BLAS/OpenMP at one thread
    assert call["thread_env"] == PINNED_THREADS
    # run_compare alternates them: every system once per repeat, in this order
    order = compare.interleaved(call["systems"], call["repeats"])
    assert [s for _, s in order[: len(systems)]] == systems
