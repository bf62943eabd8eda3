"""bench.flower_baseline's SuperNodes start on ports that are theirs: a SuperNode whose port
was taken between the draw and its bind (it exits "address already in use", as two of three
20-client SecAgg+ runs of bench-secagg did) is started again on another port, and the round
finishes.

The test holds a listening socket on the port drawn for client 0 (``free_ports`` answers it
first), so that SuperNode cannot bind it; the round of 3 clients of an 80 KB model must still
publish the FedAvg, and client 0's SuperNode must listen on another port. The socket listens,
as a server that took the port would: a connection to the port is no sign that the SuperNode
bound it (the harness reads the SuperNode's own "Uvicorn running on" line instead).
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from bench.harness import round_clients as rc
from core import services

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LAYOUT = [("a", [200, 100]), ("b", [7])]


def test_a_supernode_whose_port_was_taken_starts_again_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from bench.flower_baseline import run_flower_round

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = int(taken.getsockname()[1])
    drawn = services.free_ports

    def with_taken(n: int, host: str = "127.0.0.1") -> list[int]:
        return [port, *drawn(n - 1, host)]

    monkeypatch.setattr(services, "free_ports", with_taken)
    rc.write_weights(tmp_path / "w", LAYOUT, seed=0)
    flat = np.fromfile(tmp_path / "w", np.float32)
    try:
        with caplog.at_level("WARNING", logger="bench.flower_baseline"):
            res = run_flower_round(3, LAYOUT, timeout=300, keep_model=True)
    finally:
        taken.close()
    assert res["ok"], res
    assert f"supernode 0: port {port} taken, again" in caplog.text
    assert np.abs(res["model"] - flat).max() <= 1e-6  # all share seed 0: FedAvg = weights
