"""The two Flower peers' rounds publish the model their strategy defines, from each client's
own update (bench.flower_baseline on Flower 1.42, bench.harness.flower_legacy on 1.32.1).

Each client returns its own weights file; the published model (``keep_model``) is compared
with numpy's FedAvg (weights 100 + client index, as the clients report) or median of the same
arrays: what the robust benchmark's same-model check relies on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.harness import round_clients as rc

pytestmark = pytest.mark.integration

#: 3 x 80 KB: the first-bytes mark needs 64 KiB on the server port
LAYOUT = [("a", [200, 100]), ("b", [7])]


def _weights(tmp: Path, n: int) -> tuple[list[Path], np.ndarray]:
    files = []
    for k in range(n):
        files.append(tmp / f"w{k}")
        rc.write_weights(files[-1], LAYOUT, seed=k)
    flat = np.stack([np.fromfile(f, np.float32) for f in files])
    return files, flat


def test_the_legacy_flower_publishes_the_fedavg_of_each_clients_own_update(
    tmp_path: Path,
) -> None:
    from bench.harness.flower_legacy import run_legacy_round

    files, flat = _weights(tmp_path, 3)
    res = run_legacy_round(3, LAYOUT, timeout=120, weights=files, keep_model=True)
    assert res["ok"], res
    assert res["flwr_version"] == "1.32.1" and res["rule"] == "fedavg"
    w = np.array([100, 101, 102], np.float64)
    want = (w[:, None] * flat).sum(0) / w.sum()
    assert np.abs(res["model"] - want).max() <= 1e-6
    assert 0 <= res["server_s"] <= res["e2e_s"]  # 0: ended within the poll's lag


@pytest.mark.slow
def test_flower_142_publishes_the_median_of_each_clients_own_update(tmp_path: Path) -> None:
    from bench.flower_baseline import run_flower_round
    from bench.harness.flower_env import FLOWER_VERSION

    files, flat = _weights(tmp_path, 3)
    res = run_flower_round(3, LAYOUT, timeout=300, weights=files, rule="median", keep_model=True)
    assert res["ok"], res
    assert res["flwr_version"] == FLOWER_VERSION and res["rule"] == "median"
    assert np.array_equal(res["model"], np.median(flat, axis=0).astype(np.float32))
    assert 0 <= res["server_s"] <= res["e2e_s"]  # 0: ended within the poll's lag
    # the window's parts: bytes in, the ServerApp's poll wait and pull, aggregate_train
    assert res["pulls"] >= 1 and res["last_pull_s"] > 0 and res["poll_wait_s"] >= 0
