"""Robust aggregation benchmark (issues 15, 37): 20 ResNet-18 updates, 4 of them poisoned.

Both sides on the same 20 updates (ResNet-18's floating-point state, 44.7 MB float32 each;
honest ones are ``g + common + noise``, two are sign-flipped ``g - delta`` and two scaled
``g + 100 delta``), each client its own process holding its update (one file on /dev/shm per
client, mapped, every page resident), released at once, uploading over loopback:

- FedFaaS: one node gateway (its Redis) and one ``aggregator`` replica with two endpoints; the
  job's initial model is ``g`` and names the rule (two coordinate shards);
  :func:`bench.harness.fedfaas_round.bench_round_e2e`.
- Flower 1.42: a SuperLink, 20 SuperNodes and the ServerApp running ``FedMedian`` or ``Krum``
  (``num_malicious_nodes=4``) on the Message API; :func:`bench.flower_baseline.run_flower_round`.
- Flower 1.32.1 on its legacy ``start_server`` / ``start_client`` path (gRPC), the same
  strategies (:func:`bench.harness.flower_legacy.run_legacy_round`; ``--no-legacy`` leaves it
  out): the two Flowers move updates differently, so both are peers.

Equal windows: ``server_s`` is, on both sides, from the first update bytes received on the
server's port (the kernel's TCP counters) to the result sealed (FedFaaS: the global model
published, encoded as the body ``GET model`` serves; Flower: the strategy's ``aggregate_train``
returned its ``ArrayRecord``): receiving, decoding and aggregating the 20 updates are inside
it on both sides. ``e2e_s`` starts earlier, at the first client's weights-in-memory mark
(serialising is inside). The server side of both is in a cgroup pinned to the same CPUs
(``--cpus``; :class:`bench.harness.cgroups.RoundGroups`), the clients in another; the
cgroups give the server side's peak memory and CPU-seconds over the window. Each rule's rounds
are repeated (``--repeats``), the systems alternating
(:func:`bench.harness.compare.run_compare`); the table gives medians with [min-max] and ratios
of medians.

Distances: for each rule's published model, ``|x - h| / |h - g|`` with ``h`` the honest
updates' mean: how far the model moved from where the honest clients would take it, relative
to their step; ``same model``: the largest difference between FedFaaS's and Flower's model.
FedFaaS's other rules (no Flower peer: FedAvg, trimmed mean, Multi-Krum, FLTrust, DP-FedAvg)
run once each on the same CPUs with ``--all-rules``, for their distances.

BLAS and OpenMP pinned to one thread per process (``bench.runinfo.pinned_threads``). Usage:
``python -m bench.robust [--repeats 5] [--cpus 0-1] [--all-rules] [--out DIR]``; writes
``bench/results/robust.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.flower_baseline import CURRENT, LEGACY
from bench.harness.compare import REPEATS, run_compare, spread
from bench.runinfo import pinned_threads, run_header, run_info, stop_on_sigterm, write_result

log = logging.getLogger(__name__)

N, BAD_FLIP, BAD_SCALE = 20, ("c00", "c01"), ("c02", "c03")
RULES = [
    {"rule": "median"},
    {"rule": "trimmed-mean", "beta": 0.2},
    {"rule": "krum", "f": 4},
    {"rule": "multi-krum", "f": 4},
    {"rule": "fltrust", "root_client": "c19"},
    # central DP's path (norms, clipping, the noise drawn in the shards): clip above the honest
    # deltas' norms (about 38), so clipping bounds the scaled ones; z so small that the noise
    # (std z C / 20 = 0.0025) leaves the distance readable: a timing of the path, not a
    # privacy setting (20 clients give no useful epsilon)
    {"rule": "dp-fedavg", "clip": 50.0, "noise_multiplier": 0.001, "seed": 1},
]
OUT = Path(__file__).resolve().parent / "results"


def resnet18() -> dict[str, np.ndarray]:
    import torch
    import torchvision

    torch.manual_seed(0)
    sd = torchvision.models.resnet18(weights=None).state_dict()
    return {k: v.numpy().astype(np.float32) for k, v in sd.items() if v.is_floating_point()}


def updates(g: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(15)
    common = {k: 0.01 * rng.standard_normal(v.shape).astype(np.float32) for k, v in g.items()}
    out = {}
    for i in range(N):
        c = f"c{i:02d}"
        d = {
            k: common[k] + 0.005 * rng.standard_normal(v.shape).astype(np.float32)
            for k, v in g.items()
        }
        sign = -1.0 if c in BAD_FLIP else 100.0 if c in BAD_SCALE else 1.0
        out[c] = {k: (g[k] + sign * d[k]).astype(np.float32) for k in g}
    return out


def flat(m: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([m[k].ravel() for k in sorted(m)])


#: the rules Flower has, as each side names them: FedFaaS's spec, Flower's strategy
PEERS = {"median": ({"rule": "median"}, "median"), "krum": ({"rule": "krum", "f": 4}, "krum")}
#: ``--rules``'s default: every rule with a Flower peer (``make bench-robust`` writes them all)
DEFAULT_RULES = ",".join(PEERS)


def write_updates(
    ups: dict[str, dict[str, np.ndarray]], layout: list[tuple[str, list[int]]], folder: Path
) -> list[Path]:
    """Each client's update as one file of float32 values in ``layout``'s order (the format
    :func:`bench.harness.rc.map_weights` maps), clients in sorted order."""
    out = []
    for c in sorted(ups):
        path = folder / f"update-{c}"
        with open(path, "wb") as f:
            for name, _ in layout:
                f.write(np.ascontiguousarray(ups[c][name], np.float32).tobytes())
        out.append(path)
    return out


def _fedfaas(
    spec: dict[str, Any],
    g: dict[str, np.ndarray],
    files: list[Path],
    layout: list[tuple[str, list[int]]],
    work: Path,
) -> Callable[[Any, str], dict[str, Any]]:
    from bench.harness.fedfaas_round import bench_round_e2e
    from client.sdk import AGGREGATION_KEY, with_metadata
    from core import wire

    body = wire.encode_tensors(g)
    if spec["rule"] != "fedavg":
        body = with_metadata(body, {AGGREGATION_KEY: json.dumps({**spec, "shards": 2})})

    def run(groups: Any, tag: str) -> dict[str, Any]:
        return bench_round_e2e(
            work, layout, N, ebpf=False, tag=tag, groups=groups, weights=files,
            initial=body, keep_model=True, gateway={"pool": N + 4},
        )  # fmt: skip

    return run


def _flower(
    rule: str, files: list[Path], layout: list[tuple[str, list[int]]], legacy: bool
) -> Callable[[Any, str], dict[str, Any]]:
    from bench.flower_baseline import run_flower_round
    from bench.harness.flower_legacy import run_legacy_round

    round_of = run_legacy_round if legacy else run_flower_round

    def run(groups: Any, tag: str) -> dict[str, Any]:
        return round_of(N, layout, groups=groups, rule=rule, weights=files, keep_model=True)

    return run


def _with_distance(
    runner: Callable[[Any, str], dict[str, Any]],
    honest: np.ndarray,
    gf: np.ndarray,
    step: float,
    models: list[np.ndarray],
) -> Callable[[Any, str], dict[str, Any]]:
    """``runner`` whose record has the model's ``distance`` instead of the model (kept, the
    first one, in ``models`` for the same-model check)."""

    def run(groups: Any, tag: str) -> dict[str, Any]:
        rec = runner(groups, tag)
        model = rec.pop("model", None)
        if model is not None:
            rec["distance"] = float(np.linalg.norm(model.astype(np.float64) - honest) / step)
            if not models:
                models.append(model)
            rec["max_abs_diff_to_first"] = float(np.abs(model - models[0]).max())
        return rec

    return run


def _cell(sp: dict[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not sp:
        return "n/a"
    f = f"{{:.{digits}f}}"
    lo, mid, hi = (f.format(sp[k] / scale) for k in ("min", "median", "max"))
    return f"{mid} [{lo}-{hi}]"


#: the compared rows: label, figure of bench.harness.compare.figures, scale, the ratio's word
ROWS = (
    ("server window: first update bytes received -> result sealed (s)", "server_s", 1.0,
     "faster"),
    ("round: first client's weights in memory -> result sealed (s)", "e2e_s", 1.0, "faster"),
    ("server side's CPU-seconds in the round (cgroup)", "server_cpu_s", 1.0, "less"),
    ("server side's peak memory (cgroup, GB)", "server_peak_bytes", 1e9, "less"),
)  # fmt: skip


def render(r: dict[str, Any]) -> str:
    cpus = r["cpus"]
    lines = [
        "# Robust aggregation: 20 ResNet-18 updates, 4 poisoned",
        "",
        run_header(r["run"]),
        "",
        *(
            [
                "This result merges runs (each rule names its own): "
                + "; ".join(
                    f"`{x.get('command')}` at {(x.get('commit') or {}).get('sha', '?')[:12]}"
                    f"{' (dirty tree)' if (x.get('commit') or {}).get('dirty') else ''}, "
                    f"started {x.get('started')}"
                    for x in r["runs"]
                ),
                "",
            ]
            if r.get("runs")
            else []
        ),
        f"Poisoned: {', '.join(r['poisoned']['sign_flipped'])} sign-flipped, "
        f"{', '.join(r['poisoned']['scaled_100x'])} scaled by 100. Each client its own process "
        "uploading over loopback. Equal windows: first update bytes received on the server's "
        "port -> result sealed (FedFaaS: the model published; Flower: aggregate_train "
        "returned), receiving and decoding the updates inside on both sides. The server side "
        f"of both in a cgroup pinned to CPUs {cpus}; {r['repeats']} repeats per rule, FedFaaS "
        "and Flower alternating; median [min-max], ratios of medians. Distance: |x - h| / "
        "|h - g| (h: the honest updates' mean, g: the round's starting model).",
        "",
        "| rule | figure | FedFaaS | peers: median [min-max] | peer / FedFaaS (medians) | target |",
        "|---|---|---:|---|---|---|",
    ]
    for rule, block in r["rules"].items():
        summ = block["compare"]["by_cpus"][cpus]["summary"]
        me = summ["systems"].get("FedFaaS") or {}
        peers = {s: x for s, x in summ["systems"].items() if s != "FedFaaS"}
        for label, key, scale, word in ROWS:
            theirs = "; ".join(f"{s}: {_cell(x.get(key), scale)}" for s, x in peers.items())
            ratio = "; ".join(
                f"{s}: {v:.2f}x {word}"
                for s, rr in summ["ratios"].items()
                if (v := rr.get(key)) is not None
            )
            target = ">= 3x faster than Flower" if key == "server_s" else ""
            lines.append(
                f"| {rule} | {label} | {_cell(me.get(key), scale)} | {theirs} | {ratio or 'n/a'}"
                f" | {target} |"
            )
        dist = block["distance"]
        lines.append(
            f"| {rule} | distance from the honest mean | {_cell(dist.get('FedFaaS'), digits=4)}"
            f" | {'; '.join(f'{s}: {_cell(dist.get(s), digits=4)}' for s in peers)} | "
            f"same model: largest abs difference {block['same_model_max_abs_diff']:.2e} | |"
        )
        done = "; ".join(
            f"{s} {x.get('ok', 0)}/{x.get('runs', 0)}" for s, x in summ["systems"].items()
        )
        lines.append(f"| {rule} | runs finished | {done} | {block.get('run', '')} | | |")
    if r.get("fedfaas_only"):
        lines += [
            "",
            "FedFaaS's rules without a Flower peer, once each on the same CPUs:",
            "",
            "| rule | distance from the honest mean | server window (s) | round (s) |",
            "|---|---:|---:|---:|",
        ]
        for rule, rec in r["fedfaas_only"].items():
            if not rec.get("ok", True):
                lines.append(f"| {rule} | failed: {rec.get('failure')} | | |")
                continue
            lines.append(
                f"| {rule} | {rec['distance']:.4f} | {rec['server_s']:.3f} | {rec['e2e_s']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = list(r["rules"])
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(rules))
    systems = list(r["rules"][rules[0]]["compare"]["systems"]) if rules else []
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        off = (i - (len(systems) - 1) / 2) * width
        cells = [
            r["rules"][k]["compare"]["by_cpus"][r["cpus"]]["summary"]["systems"][system].get(
                "server_s"
            )
            or {"median": 0, "min": 0, "max": 0}
            for k in rules
        ]
        med = [c["median"] for c in cells]
        err = [[m - c["min"] for m, c in zip(med, cells, strict=True)],
               [c["max"] - m for m, c in zip(med, cells, strict=True)]]  # fmt: skip
        ax.bar(x + off, med, width, yerr=err, capsize=4, label=system)
    ax.set_xticks(x, rules)
    ax.set_ylabel("server window (s): first update byte -> result sealed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def _rule_block(cmp: dict[str, Any], cpus: str, command: str) -> dict[str, Any]:
    """One rule's part of the result: its comparison, each system's distances and the
    largest difference between any finished run's model and the first one's."""
    runs = cmp["by_cpus"][cpus]["runs"]
    return {
        "run": command,
        "compare": cmp,
        "distance": {s: spread([x.get("distance") for x in recs]) for s, recs in runs.items()},
        "same_model_max_abs_diff": max(
            (x.get("max_abs_diff_to_first", np.inf) for recs in runs.values() for x in recs
             if x.get("ok", True)),
            default=float("inf"),
        ),
    }  # fmt: skip


def _appended(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """``result`` with the rules of the result stored at ``path`` that it did not run (a
    stored result of other CPUs or repeats is refused: its rows would not compare)."""
    if not path.exists():
        return result
    old = json.loads(path.read_text())
    if (old.get("cpus"), old.get("repeats")) != (result["cpus"], result["repeats"]):
        raise SystemExit(
            f"{path}: CPUs {old.get('cpus')} x {old.get('repeats')} repeats, this run "
            f"{result['cpus']} x {result['repeats']}: not appended"
        )
    rules = {**{k: v for k, v in old["rules"].items() if k not in result["rules"]}}
    rules.update(result["rules"])
    mine = result["run"].get("started")  # this run's earlier partial writes are replaced
    runs = [x for x in old.get("runs", [old["run"]]) if x.get("started") != mine]
    runs.append(result["run"])
    return {
        **result,
        "rules": rules,
        "fedfaas_only": result["fedfaas_only"] or old.get("fedfaas_only", {}),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="rounds per rule and system")
    ap.add_argument("--cpus", default="0-1", help="the server side's CPUs (cpuset), both sides")
    ap.add_argument("--rules", default=DEFAULT_RULES, help="rules with a Flower peer")
    ap.add_argument(
        "--all-rules", action="store_true", help="FedFaaS's other rules once, for distances"
    )
    ap.add_argument("--no-legacy", action="store_true", help="leave out Flower 1.32.1")
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the other rules of the stored robust.json (same --cpus and --repeats): "
        "one rule per run, each rule naming its run",
    )
    args = ap.parse_args(argv)
    stop_on_sigterm()  # a SIGTERM still takes the run's processes, groups and files down
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with pinned_threads(1) as threads:
        info = run_info("bench.robust", argv)
        info["threads"] = threads
        g = resnet18()
        ups = updates(g)
        layout = [(k, list(g[k].shape)) for k in sorted(g)]
        gf = flat(g)
        honest = np.mean([flat(u) for c, u in ups.items() if c not in BAD_FLIP + BAD_SCALE], axis=0)
        step = float(np.linalg.norm(honest - gf))
        result: dict[str, Any] = {
            "run": info,
            "clients": N,
            "poisoned": {"sign_flipped": list(BAD_FLIP), "scaled_100x": list(BAD_SCALE)},
            "cpus": args.cpus,
            "repeats": args.repeats,
            "rules": {},
            "fedfaas_only": {},
        }
        with tempfile.TemporaryDirectory(prefix="bench-robust-", dir="/dev/shm") as d:
            tmp = Path(d)
            files = write_updates(ups, layout, tmp)
            del ups
            for rule in args.rules.split(","):
                spec, strategy = PEERS[rule]
                models: list[np.ndarray] = []
                runners = {
                    "FedFaaS": _with_distance(
                        _fedfaas(spec, g, files, layout, tmp / rule), honest, gf, step, models
                    ),
                    CURRENT: _with_distance(
                        _flower(strategy, files, layout, False), honest, gf, step, models
                    ),
                }
                if not args.no_legacy:
                    runners[LEGACY] = _with_distance(
                        _flower(strategy, files, layout, True), honest, gf, step, models
                    )
                (tmp / rule).mkdir()

                def keep(cmp: dict[str, Any], rule: str = rule) -> None:
                    """The rule's block as it stands; written after every run (a run cut
                    short keeps what it did)."""
                    result["rules"][rule] = _rule_block(cmp, args.cpus, info["command"])
                    write_result(
                        _appended(result, args.out / "robust.json") if args.append else result,
                        "robust",
                        render,
                        args.out,
                    )

                run_compare(runners, cpus_sets=[args.cpus], repeats=args.repeats, after_run=keep)
            if args.all_rules:
                from bench.harness.cgroups import RoundGroups

                for spec in [{"rule": "fedavg"}, *RULES]:
                    if spec["rule"] in PEERS:
                        continue
                    run = _with_distance(
                        _fedfaas(spec, g, files, layout, tmp / spec["rule"]), honest, gf, step, []
                    )
                    (tmp / spec["rule"]).mkdir()
                    tag = f"o{len(result['fedfaas_only'])}"
                    with RoundGroups(f"fedfaas-bench-{os.getpid()}-{tag}", args.cpus) as groups:
                        result["fedfaas_only"][spec["rule"]] = run(groups, tag)
    if args.append:
        result = _appended(result, args.out / "robust.json")
    stored, md = write_result(result, "robust", render, args.out)
    plot(stored, args.out / "robust.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
