"""bench-secagg (issue 41) run tiny: 4 clients of a 1 MB model, FedFaaS's secure round on
``fedfaas up --with control-plane`` and Flower 1.42's SecAgg+ (its ``SecAggPlusWorkflow`` and
``secaggplus_mod`` on a SuperLink and SuperNodes, and on its Simulation Runtime), with no
dropout and with one client dropped after its masked upload, before unmasking.

Both systems finish every round and publish the clients' weights (all clients share them, so
the FedAvg is the weights) within the quantization's error, not a masked vector; each
surviving client moved at least its update; the result names the parameters both ran with and
is rendered to Markdown and a plot. Beside it, without processes: both systems get the same
SecAgg+ parameters, in the names each uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import secagg
from core.secagg.config import SecAggConfig


def test_both_systems_get_the_same_secagg_parameters() -> None:
    params = secagg.parameters(20, 8, 30.0)
    cfg = SecAggConfig.from_spec(params["fedfaas"])
    flower = params["flower"]
    assert flower["num-shares"] == cfg.degree(20) + 1 == 9  # the neighbours and the client
    assert flower["reconstruction-threshold"] == cfg.shares_needed(20) == 6
    assert flower["clipping-range"] == cfg.clip
    assert flower["quantization-range"] == 1 << cfg.bits == 4194304  # Flower's default
    assert flower["max-weight"] == cfg.max_weight and flower["timeout"] == cfg.stage_timeout_s
    small = secagg.parameters(4, 8, 30.0)  # every other client a neighbour
    assert small["flower"]["num-shares"] == 4 and small["flower"]["reconstruction-threshold"] == 2


@pytest.mark.slow
@pytest.mark.integration
def test_a_tiny_run_publishes_the_fedavg_on_both_and_writes_its_report(tmp_path: Path) -> None:
    argv = ["--clients", "4", "--drop", "1", "--mb", "1", "--repeats", "1",
            "--stage-timeout", "30", "--timeout", "300", "--out", str(tmp_path)]  # fmt: skip
    assert secagg.main(argv) == 0
    res = json.loads((tmp_path / "secagg.json").read_text())
    assert list(res["dropouts"]) == ["0% dropout (0 of 4)", "25% dropout (1 of 4)"]
    for label, block in res["dropouts"].items():
        runs = block["compare"]["by_cpus"]["0-1"]["runs"]
        for system in (secagg.FEDFAAS, secagg.FLOWER, secagg.FLOWER_SIM):
            [rec] = runs[system]
            assert rec.get("ok"), (label, system, rec.get("detail"))
            # the weights are ~0.05 x N(0, 1): a masked or wrong model is off by far more
            assert rec["max_error"] < 1e-3, (label, system, rec["max_error"])
            assert rec["bytes_per_client"] >= res["config"]["update_bytes"], (label, system)
            assert rec["cgroup"]["server"]["cpu_s"] > 0 and rec["e2e_s"] > 0
        fedfaas = runs[secagg.FEDFAAS][0]
        assert [m["cid"] for m in fedfaas["clients"] if m["dropped"]] == block["dropped"]
        simulated = runs[secagg.FLOWER_SIM][0]
        assert simulated["runtime"] == "simulation" and simulated["num_clients"] == 4
        # the Ray head and its actors are the clients' side, the ServerApp the server's
        assert simulated["cgroup"]["clients"]["cpu_s"] > 0
        assert block["summary"]["ratios_simulation"]["round_s"] is not None
    md = (tmp_path / "secagg.md").read_text()
    assert "Flower 1.42 SecAgg+" in md and "3x target, Flower / FedFaaS (4 clients)" in md
    assert "3x target, Flower's Simulation Runtime / FedFaaS (4 clients)" in md
    assert (tmp_path / "secagg.png").stat().st_size > 0


def _fake_compare(runners: object, **kw: object) -> dict[str, object]:
    rec = {"ok": True, "e2e_s": 1.0, "bytes_per_client": 1.0, "max_error": 0.0}
    runs = {secagg.FEDFAAS: [rec], secagg.FLOWER: [dict(rec, e2e_s=3.0)]}
    return {"systems": list(runs), "order": "", "by_cpus": {"0-1": {"runs": runs}}}


def test_merge_keeps_the_other_setting_of_the_same_size_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--merge`` replaces the settings it runs and keeps the stored others, unless they
    were run with other clients or another update size (the logic alone: the rounds faked)."""
    from bench.harness import compare

    monkeypatch.setattr(compare, "run_compare", _fake_compare)
    monkeypatch.setattr(secagg, "runners", lambda *a: {})
    monkeypatch.setattr(secagg, "stop_on_sigterm", lambda: None)  # pytest keeps its own
    base = ["--clients", "4", "--drop", "1", "--mb", "1", "--out", str(tmp_path)]

    def stored() -> list[str]:
        return list(json.loads((tmp_path / "secagg.json").read_text())["dropouts"])

    assert secagg.main([*base, "--dropouts", "0"]) == 0
    assert secagg.main([*base, "--dropouts", "drop", "--merge"]) == 0
    assert stored() == ["0% dropout (0 of 4)", "25% dropout (1 of 4)"]
    md = (tmp_path / "secagg.md").read_text()
    assert "3.00x faster" in md
    assert md.count("Run: `") == 2  # the kept setting says which invocation ran it
    other = ["--clients", "5", "--drop", "1", "--mb", "1", "--out", str(tmp_path)]
    assert secagg.main([*other, "--dropouts", "drop", "--merge"]) == 0
    assert stored() == ["20% dropout (1 of 5)"]


def test_fewer_flower_clients_compare_like_for_like_beside_the_full_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--flower-clients 10`` of ``--clients 20``: FedFaaS and Flower's Deployment Runtime
    run 10 clients (the first ratio is between them), FedFaaS's 20-client round is a third
    column and Flower's Simulation Runtime at 20 a fourth (the second ratio: it over FedFaaS
    at 20); 2 of 20 dropped is 1 of 10; the report says why Flower's Deployment Runtime ran
    fewer, with its clients' measured peak (the rounds faked, the logic alone)."""
    from bench.harness import compare

    full = secagg.all_clients_system(20)
    seen: dict[str, object] = {}

    def fake_runners(args: object, layout: object, drops: dict[int, list[int]]) -> dict:
        seen["drops"] = drops
        return {}

    def fake_compare(runners: object, **kw: object) -> dict[str, object]:
        rec = {"ok": True, "e2e_s": 1.0, "bytes_per_client": 1.0, "max_error": 0.0,
               "num_clients": 10, "cgroup": {"clients": {"peak_bytes": 5e9}}}  # fmt: skip
        runs = {
            secagg.FEDFAAS: [rec],
            secagg.FLOWER: [dict(rec, e2e_s=4.0, cgroup={"clients": {"peak_bytes": 11e9}})],
            full: [dict(rec, e2e_s=2.0, num_clients=20)],
            secagg.FLOWER_SIM: [
                dict(rec, e2e_s=7.0, num_clients=20, cgroup={"clients": {"peak_bytes": 2e9}})
            ],
        }
        return {"systems": list(runs), "order": "", "by_cpus": {"0-1": {"runs": runs}}}

    monkeypatch.setattr(compare, "run_compare", fake_compare)
    monkeypatch.setattr(secagg, "runners", fake_runners)
    monkeypatch.setattr(secagg, "stop_on_sigterm", lambda: None)
    argv = ["--clients", "20", "--flower-clients", "10", "--drop", "2", "--mb", "1",
            "--dropouts", "drop", "--out", str(tmp_path)]  # fmt: skip
    assert secagg.main(argv) == 0
    assert seen["drops"] == {20: [18, 19], 10: [9]}
    res = json.loads((tmp_path / "secagg.json").read_text())
    assert res["config"]["flower_clients"] == 10
    assert res["config"]["parameters"]["flower"]["num-shares"] == 9  # 8 neighbours at 10 too
    [(label, block)] = res["dropouts"].items()
    assert label == "10% dropout (2 of 20; 1 of 10)" and block["dropped"] == [9]
    assert block["summary"]["ratios"]["round_s"] == 4.0  # Flower / FedFaaS, both at 10
    assert block["summary"]["ratios_simulation"]["round_s"] == 3.5  # both at 20
    md = (tmp_path / "secagg.md").read_text()
    assert ("| FedFaaS (10 clients) | Flower 1.42 SecAgg+ (10 clients) | FedFaaS, 20 clients | "
            "Flower 1.42 SecAgg+, Simulation Runtime (20 clients) | Flower / FedFaaS (10 "
            "clients) | Flower's Simulation Runtime / FedFaaS (20 clients) |") in md  # fmt: skip
    assert "Flower's Deployment Runtime runs 10 clients, not 20" in md
    assert "1.10 GB per client at its peak, about 22 GB at 20 clients" in md
    assert "3x target, Flower / FedFaaS (10 clients): met (4.00x)" in md
    assert "3x target, Flower's Simulation Runtime / FedFaaS (20 clients): met (3.50x)" in md
    assert "| round time (s) | 1.00 [1.00-1.00] | 4.00 [4.00-4.00] | 2.00 [2.00-2.00] | " in md
    # Flower's Simulation Runtime's clients' peak is under FedFaaS's: said as FedFaaS's "more"
    assert (
        "| 5.00 [5.00-5.00] | 11.00 [11.00-11.00] | 5.00 [5.00-5.00] | 2.00 [2.00-2.00] | "
        "2.20x less | 2.50x more |" in md
    )
    assert (tmp_path / "secagg.png").stat().st_size > 0
