"""bench.robust's equal windows (issue 37): the same poisoned updates, each client its own
process, FedFaaS, Flower 1.42 and Flower 1.32.1's legacy server measured from the first update
bytes received to the result sealed, on the same CPUs.

The slow test runs the benchmark itself on a small model and 8 clients (2 sign-flipped, 2
scaled): every system finishes every round, each system's server window lies inside its round,
the three publish the same median (and the same Krum choice), and the rendered table has a
ratio of medians for every peer. The others check the table from a stored result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import robust
from bench.flower_baseline import CURRENT, LEGACY


def _small() -> dict[str, np.ndarray]:
    """A 2 MB model: small, yet each round outlasts the resolution of the first-bytes mark
    (the server port polled every 2 ms for 64 KiB received); with 12 KB updates a fast round
    could publish before the poll saw its first bytes."""
    rng = np.random.default_rng(0)
    return {
        "conv.weight": rng.normal(0, 0.05, (16, 3, 3, 3)).astype(np.float32),
        "fc.bias": rng.normal(0, 0.05, 10).astype(np.float32),
        "fc.weight": rng.normal(0, 0.05, (10, 50_000)).astype(np.float32),
    }


@pytest.mark.slow
@pytest.mark.integration
def test_the_robust_rounds_have_equal_windows_and_the_same_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robust, "N", 8)
    monkeypatch.setattr(robust, "resnet18", _small)
    assert robust.main(["--out", str(tmp_path), "--repeats", "1", "--cpus", "0"]) == 0
    r = json.loads((tmp_path / "robust.json").read_text())
    for rule in ("median", "krum"):
        block = r["rules"][rule]
        runs = block["compare"]["by_cpus"]["0"]["runs"]
        assert set(runs) == {"FedFaaS", CURRENT, LEGACY}
        for system, recs in runs.items():
            [rec] = recs
            assert rec["ok"], (system, rec.get("detail"))
            # the server window starts at the first update byte received: inside the round
            assert 0 <= rec["server_s"] <= rec["e2e_s"], (system, rec)  # 0: within the poll lag
            assert rec["cgroup"]["server"]["cpus"] == "0"
        # the same model from all three (float32 medians of the same values; Krum's pick)
        assert block["same_model_max_abs_diff"] <= 1e-6, block["same_model_max_abs_diff"]
    md = (tmp_path / "robust.md").read_text()
    assert f"{CURRENT}: " in md and f"{LEGACY}: " in md and "x faster" in md
    # the poisoned clients do not move the median far from the honest mean: FedAvg would
    assert r["rules"]["median"]["distance"]["FedFaaS"]["median"] < 1.0


def _stored() -> dict[str, Any]:
    def rec(server_s: float, e2e_s: float, distance: float) -> dict[str, Any]:
        cg = {"server": {"peak_bytes": 2e9, "cpu_s": 3.0}, "clients": {"peak_bytes": 1e9}}
        return {"ok": True, "server_s": server_s, "e2e_s": e2e_s, "distance": distance,
                "cgroup": cg}  # fmt: skip

    from bench.harness.compare import spread, summarise

    runs = {
        "FedFaaS": [rec(1.0, 1.5, 0.09), rec(1.2, 1.7, 0.09), rec(0.8, 1.4, 0.09)],
        CURRENT: [rec(9.0, 10.0, 0.09), rec(11.0, 12.0, 0.09), rec(10.0, 11.0, 0.09)],
    }
    return {
        "run": {"module": "bench.robust", "argv": [], "started": "now", "finished": "now",
                "commit": {"sha": "abc", "dirty": False}, "machine": {}},
        "clients": 20,
        "poisoned": {"sign_flipped": ["c00", "c01"], "scaled_100x": ["c02", "c03"]},
        "cpus": "0-1",
        "repeats": 3,
        "rules": {"median": {
            "compare": {"systems": list(runs), "repeats": 3,
                        "by_cpus": {"0-1": {"runs": runs, "summary": summarise(runs)}}},
            "distance": {s: spread([x["distance"] for x in v]) for s, v in runs.items()},
            "same_model_max_abs_diff": 0.0,
        }},
        "fedfaas_only": {},
    }  # fmt: skip


def test_the_table_gives_medians_ranges_and_ratios_of_medians() -> None:
    md = robust.render(_stored())
    row = next(line for line in md.splitlines() if "server window" in line)
    assert "| 1.00 [0.80-1.20] |" in row  # FedFaaS: median [min-max]
    assert f"{CURRENT}: 10.00 [9.00-11.00]" in row
    assert f"{CURRENT}: 10.00x faster" in row  # 10.0 / 1.0, the medians' ratio
    assert ">= 3x faster than Flower" in row


def test_a_rule_run_alone_is_appended_to_the_stored_result_of_the_same_setup(
    tmp_path: Path,
) -> None:
    stored = _stored()
    (tmp_path / "robust.json").write_text(json.dumps(stored))
    run = {**stored["run"], "command": "python -m bench.robust --rules krum", "started": "later"}
    krum = {**stored, "run": run}
    krum["rules"] = {"krum": stored["rules"]["median"]}
    merged = robust._appended(krum, tmp_path / "robust.json")
    assert list(merged["rules"]) == ["median", "krum"]
    assert [x.get("command") for x in merged["runs"]] == [
        None,
        "python -m bench.robust --rules krum",
    ]
    assert "This result merges runs" in robust.render(merged)
    # the same run writing again (after each of its rounds) replaces its own entry
    (tmp_path / "robust.json").write_text(json.dumps(merged))
    again = robust._appended(krum, tmp_path / "robust.json")
    assert [x.get("command") for x in again["runs"]] == [None, run["command"]]
    with pytest.raises(SystemExit, match="not appended"):
        robust._appended({**krum, "cpus": "0"}, tmp_path / "robust.json")
