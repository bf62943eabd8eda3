"""bench-secagg (issue 41): a secure round of FedFaaS against Flower's SecAgg+, same run, same
CPUs.

Each system runs one round of ``--clients`` clients whose "trained weights" are float32 arrays
laid out like ResNet-18's state dict (44.8 MB; ``--mb`` scales it), the same values on both
sides (:mod:`bench.harness.round_clients`), with 0% and then ``--drop`` clients dropped after
sending their masked vectors and before unmasking (10% of 20: 2):

- FedFaaS: ``fedfaas up --with control-plane`` and its SDK's participant
  (:mod:`bench.secagg_fedfaas`): the control plane carries the stages, the node gateways fold
  the masked vectors in Z_2^32 as they arrive, the root unmasks;
- Flower 1.42: the SuperLink, one SuperNode per client, ``flwr run`` of the App of its own
  example (``SecAggPlusWorkflow`` + ``secaggplus_mod``, :mod:`bench.secagg_flower_app`), run
  by :func:`bench.flower_baseline.run_flower_round` (its Deployment Runtime);
- and the same App on Flower's Simulation Runtime at ``--clients``
  (:func:`bench.flower_simulation.run_flower_simulation_round`: Ray actors, messages in
  memory; ``--no-flower-simulation`` leaves it out), the runtime Flower's own example uses,
  which fits the machine where the Deployment Runtime's 20 clients do not.

The same SecAgg+ parameters on both where Flower exposes them: each client's neighbours
(FedFaaS ``neighbours`` = Flower ``num_shares`` - 1), the shares that rebuild a seed
(``threshold``), the clipping range, the quantization levels (FedFaaS ``bits`` = 22, Flower's
``quantization_range`` 2^22, its default), ``max_weight``, and the time a stage waits for a
client that does not answer (FedFaaS ``stage_timeout_s``, Flower's unmask stage's
``timeout``). A dropped client never answers: Flower waits out its unmask timeout; FedFaaS
sends the root the material once the shares in hand rebuild every seed
(:meth:`core.secagg.coordinator.Coordinator.can_unmask`) and waits its timeout only when they
do not.
Both over plain HTTP on loopback (Flower's ``--insecure``).

Per run: the round's time (the first client released -> the published model: the root
gateway's ``published_ns``, Flower's ``aggregate_train`` returned), the payload bytes each
surviving client sent and received (HTTP bodies; Flower's message records), and the server
cgroup's peak memory and CPU-seconds over the round (FedFaaS: MinIO, Redis, the runtime and its
aggregators, two gateways, the control plane; Flower: the SuperLink, its SuperExec and
ServerApp), each system's processes in fresh cgroups (:func:`bench.harness.compare.run_compare`,
interleaved, ``--repeats`` each). Medians [min-max]. The published model is checked against
the clients' weights on both sides (its largest error).

``python -m bench.secagg [--clients 20] [--flower-clients 10] [--drop 2] [--repeats 3]
[--dropouts 0,drop] [--merge]`` writes ``bench/results/secagg.{json,md,png}`` (``--merge``: the dropout settings
run now replace theirs in the stored result, the others kept when they had the same clients
and update size, each setting with its own run's header); ``--from-json`` re-renders.

``--flower-clients N``: where Flower's Deployment Runtime does not fit the machine at
``--clients`` (each of its clients is a SuperNode, a SuperExec and a ClientApp process per
message, and under SecAgg+ a ClientApp makes its update int64 and adds a 64-bit mask of that
size per neighbour, one after another), FedFaaS and that runtime both run ``N`` clients (the
first ratio column is between them) and FedFaaS's round at ``--clients`` is a third column,
beside Flower's Simulation Runtime at ``--clients`` (the second ratio column); the dropped
share is the same at both sizes (2 of 20 is 1 of 10).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import round_clients as rc
from bench.harness.compare import spread
from bench.runinfo import (
    pinned_threads,
    rerender,
    run_header,
    run_info,
    stop_on_sigterm,
    write_result,
)

NAME = "secagg"
RESULTS = Path(__file__).resolve().parent / "results"
FEDFAAS, FLOWER = "FedFaaS", "Flower 1.42 SecAgg+"
FLOWER_SIM = "Flower 1.42 SecAgg+, Simulation Runtime"
FLOWER_APP = Path(__file__).resolve().parent / "secagg_flower_app.py"
log = logging.getLogger(__name__)


def parameters(clients: int, neighbours: int, timeout: float) -> dict[str, Any]:
    """Both systems' SecAgg+ parameters: ``{"fedfaas": job spec, "flower": run config}``."""
    from core.secagg.config import SecAggConfig

    spec = {"neighbours": neighbours, "clip": 8.0, "bits": 22, "max_weight": 1000,
            "stage_timeout_s": timeout}  # fmt: skip
    cfg = SecAggConfig.from_spec(spec)
    k = cfg.degree(clients)
    flower = {
        "num-shares": k + 1,
        "reconstruction-threshold": cfg.shares_needed(clients),
        "clipping-range": cfg.clip,
        "quantization-range": 1 << cfg.bits,
        "max-weight": float(cfg.max_weight),
        "timeout": timeout,
    }
    return {"fedfaas": spec, "flower": flower}


def _weights(work: Path) -> np.ndarray:
    """The clients' weights (all share one file) as one flat vector, in layout order."""
    layout, weights = rc.client_weights(work, 0)
    return np.concatenate([np.asarray(weights[n]).ravel() for n, _ in layout])


def _flower_extra(drop: list[int]) -> Any:
    """Flower's figures read from the round's folder: bytes per surviving client, the
    published model's largest error."""

    def collect(work: Path) -> dict[str, Any]:
        per: dict[int, int] = {}
        for path in work.glob("bytes-*.json"):
            cid = int(path.name.split("-")[1])
            counts = json.loads(path.read_text())
            per[cid] = per.get(cid, 0) + counts["sent"] + counts["received"]
        survivors = [b for c, b in per.items() if c not in drop]
        model = np.load(work / "global.npy")
        return {
            "bytes_per_client": float(np.median(survivors)) if survivors else None,
            "max_error": float(np.abs(model - _weights(work)).max()),
        }

    return collect


def _fedfaas_error(rec: dict[str, Any], work_weights: np.ndarray) -> None:
    model = rec.pop("model", None)
    if model is not None:
        rec["max_error"] = float(np.abs(model - work_weights).max())


def all_clients_system(clients: int) -> str:
    """The name of FedFaaS's row at the full client count, beside the smaller like-for-like
    pair when Flower runs fewer clients (``--flower-clients``)."""
    return f"{FEDFAAS}, {clients} clients"


def runners(
    args: argparse.Namespace,
    layout: list[tuple[str, list[int]]],
    drops: dict[int, list[int]],
) -> dict[str, Any]:
    """Each system's round (:func:`bench.harness.compare.run_compare`'s runners): FedFaaS and
    Flower at ``args.flower_clients`` clients, and FedFaaS at ``args.clients`` beside them
    when that is more; ``drops``: the clients dropped at each size."""
    from bench.flower_baseline import run_flower_round
    from bench.flower_simulation import run_flower_simulation_round
    from bench.secagg_fedfaas import fedfaas_secagg_round

    small = flower_clients(args)
    expected = _expected(layout)

    def fedfaas_at(n: int) -> Any:
        spec = parameters(n, args.neighbours, args.stage_timeout)["fedfaas"]

        def fedfaas(groups: Any, tag: str) -> dict[str, Any]:
            rec = fedfaas_secagg_round(n, layout, spec, drops[n], groups=groups, keep_model=True)
            if rec.get("ok"):
                _fedfaas_error(rec, expected)
                survivors = [m for m in rec["clients"] if not m["dropped"]]
                rec["bytes_per_client"] = float(
                    np.median([m["sent"] + m["received"] for m in survivors])
                )
            return rec

        return fedfaas

    flower_cfg = {
        **parameters(small, args.neighbours, args.stage_timeout)["flower"],
        "drop": ",".join(str(c) for c in drops[small]),
    }

    def flower(groups: Any, tag: str) -> dict[str, Any]:
        return run_flower_round(
            small, layout, groups=groups, app=FLOWER_APP, app_config=flower_cfg,
            collect=_flower_extra(drops[small]), timeout=args.timeout,
        )  # fmt: skip

    sim_cfg = {
        **parameters(args.clients, args.neighbours, args.stage_timeout)["flower"],
        "drop": ",".join(str(c) for c in drops[args.clients]),
    }

    def flower_simulation(groups: Any, tag: str) -> dict[str, Any]:
        return run_flower_simulation_round(
            args.clients, layout, groups=groups, app=FLOWER_APP, app_config=sim_cfg,
            collect=_flower_extra(drops[args.clients]), timeout=args.timeout,
            failures=len(drops[args.clients]),
        )  # fmt: skip

    out = {FEDFAAS: fedfaas_at(small), FLOWER: flower}
    if small != args.clients:
        out[all_clients_system(args.clients)] = fedfaas_at(args.clients)
    if args.flower_simulation:
        out[FLOWER_SIM] = flower_simulation
    return out


def flower_clients(args: argparse.Namespace) -> int:
    """The clients of the like-for-like pair: ``--flower-clients``, at most ``--clients``."""
    return min(int(args.flower_clients or args.clients), int(args.clients))


def _expected(layout: list[tuple[str, list[int]]]) -> np.ndarray:
    """The clients' weights (seed 0, :func:`bench.harness.round_clients.write_weights`) flat
    in name order, as FedFaaS's model is flattened."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w"
        rc.write_weights(path, layout, seed=0)
        weights = rc.map_weights(path, layout)
        return np.concatenate([np.asarray(weights[n]).ravel() for n in sorted(weights)])


# ------------------------------------------------------------------------------ the report
def summary(compare: dict[str, Any]) -> dict[str, Any]:
    """Per system: its clients, round s, bytes per client, server peak and CPU-s, the
    clients' side peak, largest model error (each a spread over the runs that finished);
    Flower's figures over FedFaaS's at the same clients (``ratios``); ``systems`` in order."""
    [block] = compare["by_cpus"].values()
    out: dict[str, Any] = {"systems": list(block["runs"])}
    for system, recs in block["runs"].items():
        done = [r for r in recs if r.get("ok", True)]
        cg = [(r.get("cgroup") or {}).get("server") or {} for r in done]
        cl = [(r.get("cgroup") or {}).get("clients") or {} for r in done]
        out[system] = {
            "runs": len(recs),
            "ok": len(done),
            "clients": next((r["num_clients"] for r in recs if r.get("num_clients")), None),
            "round_s": spread([r.get("e2e_s") for r in done]),
            "bytes_per_client": spread([r.get("bytes_per_client") for r in done]),
            "server_peak_bytes": spread([c.get("peak_bytes") for c in cg]),
            "server_cpu_s": spread([c.get("cpu_s") for c in cg]),
            "clients_peak_bytes": spread([c.get("peak_bytes") for c in cl]),
            "max_error": spread([r.get("max_error") for r in done]),
            "failures": [str(r.get("detail") or r.get("reason") or r.get("failure"))[:300]
                         for r in recs if not r.get("ok", True)],
        }  # fmt: skip
    out["ratios"] = _ratios(out.get(FLOWER) or {}, out.get(FEDFAAS) or {})
    if FLOWER_SIM in out:  # against FedFaaS at the same (full) client count
        full = all_clients_system(out[FLOWER_SIM]["clients"])
        out["ratios_simulation"] = _ratios(out[FLOWER_SIM], out.get(full) or out.get(FEDFAAS) or {})
    return out


def _ratios(them: dict[str, Any], me: dict[str, Any]) -> dict[str, float | None]:
    """Each figure's median, ``them`` over ``me`` (None where either has none)."""
    return {
        k: them[k]["median"] / me[k]["median"]
        if (me.get(k) and them.get(k) and me[k]["median"])
        else None
        for k in (
            "round_s", "bytes_per_client", "server_peak_bytes", "server_cpu_s",
            "clients_peak_bytes",
        )
    }  # fmt: skip


ROWS = (
    ("round time (s)", "round_s", 1.0, "faster"),
    ("bytes per surviving client, sent + received (MB)", "bytes_per_client", 1e6, "fewer"),
    ("server peak memory, cgroup (GB)", "server_peak_bytes", 1e9, "less"),
    ("server CPU-seconds, cgroup", "server_cpu_s", 1.0, "fewer"),
    ("clients' side peak memory, cgroup, all clients (GB)", "clients_peak_bytes", 1e9, "less"),
    ("published model's largest error vs the clients' weights", "max_error", 1.0, ""),
)


#: a ratio's word when FedFaaS's figure is the larger (Flower / FedFaaS under 1)
OPPOSITE = {"faster": "slower", "fewer": "more", "less": "more"}


def _ratio_cell(ratio: float | None, word: str) -> str:
    """Flower's figure over FedFaaS's, said from FedFaaS's side: ``2.00x fewer``, or for a
    ratio under 1 its inverse with the opposite word (``1.12x more``)."""
    if not ratio or not word:
        return ""
    return f"{ratio:.2f}x {word}" if ratio >= 1 else f"{1 / ratio:.2f}x {OPPOSITE[word]}"


def _cell(s: dict[str, float] | None, scale: float) -> str:
    if not s:
        return "n/a"
    fmt = "{:.3g}" if scale == 1.0 and s["median"] < 0.01 else "{:.2f}"
    m, lo, hi = (fmt.format(s[k] / scale) for k in ("median", "min", "max"))
    return f"{m} [{lo}-{hi}]"


def _systems(s: dict[str, Any]) -> list[str]:
    return list(s.get("systems") or (FEDFAAS, FLOWER))


def _named(system: str, clients: int | None) -> str:
    """A system's column name: FedFaaS's and Flower's with their clients."""
    named = (FEDFAAS, FLOWER, FLOWER_SIM)
    return f"{system} ({clients} clients)" if clients and system in named else system


def _fewer_clients_note(result: dict[str, Any]) -> list[str]:
    """What the header says when Flower ran fewer clients than FedFaaS's full row."""
    cfg = result["config"]
    small = cfg.get("flower_clients") or cfg["clients"]
    if small == cfg["clients"]:
        return []
    per = []
    for block in result["dropouts"].values():
        fl = block["summary"].get(FLOWER) or {}
        if fl.get("clients_peak_bytes") and fl.get("clients"):
            per.append(fl["clients_peak_bytes"]["median"] / fl["clients"])
    mem = (result["run"].get("machine") or {}).get("memory_gib")
    seen = (
        f" (its clients' side measured here: {max(per) / 1e9:.2f} GB per client at its peak, "
        f"about {max(per) * cfg['clients'] / 1e9:.0f} GB at {cfg['clients']} clients, beside "
        f"its server's, on a machine of {mem} GiB)"
        if per
        else ""
    )
    at_full = (
        f", and at {cfg['clients']} clients against Flower on its Simulation Runtime (the "
        "last ratio column; see above)"
        if _simulated(result)
        else f", and FedFaaS's round at {cfg['clients']} clients is beside them"
    )
    return [
        f"Flower's Deployment Runtime runs {small} clients, not {cfg['clients']}, for this "
        "machine's memory: each of its clients is a SuperNode, its SuperExec and a ClientApp "
        "process per message, and under SecAgg+ the ClientApp makes its update int64 and "
        "adds to it a 64-bit mask of the same size per neighbour, one after another"
        f"{seen}. So FedFaaS and Flower's Deployment Runtime are compared at {small} clients "
        f"(the first ratio column){at_full}.",
        "",
    ]


def _simulated(result: dict[str, Any]) -> bool:
    """Whether Flower's Simulation Runtime ran in any of the result's settings."""
    return any(FLOWER_SIM in b["summary"] for b in result["dropouts"].values())


def _simulation_note(result: dict[str, Any]) -> list[str]:
    """What the header says of the Simulation Runtime's column, when it ran."""
    if not _simulated(result):
        return []
    return [
        "Flower's Simulation Runtime (its `flower-secure-aggregation` example's runtime; "
        f"{result['config']['clients']} virtual SuperNodes, `flower-superlink --simulation` "
        "and a Ray head of its own, in a network namespace with loopback alone): the "
        "ClientApps run in Ray actors of 1 CPU, as many at once as the clients' CPUs, and the "
        "messages never leave the machine's memory, so Flower does less work there than over "
        "its Deployment Runtime. Server side: the SuperLink and `flwr-simulation` (the "
        "ServerApp and the runtime); clients' side: the Ray head and its actors. A dropped "
        "client answers its unmask message with an error at once (an actor held would hold "
        "the clients queued behind it), which Flower counts as a dropout without waiting out "
        "the timeout.",
        "",
    ]


def _ratio_columns(
    s: dict[str, Any], cfg: dict[str, Any]
) -> list[tuple[str, dict[str, float | None]]]:
    """The ratio columns of a setting's table: (title, ratios), Flower's Deployment Runtime
    over FedFaaS at the same clients, and its Simulation Runtime's where it ran."""
    small = cfg.get("flower_clients") or cfg["clients"]
    out = [(f"Flower / FedFaaS ({small} clients)", s["ratios"])]
    if s.get("ratios_simulation") is not None:
        title = f"Flower's Simulation Runtime / FedFaaS ({cfg['clients']} clients)"
        out.append((title, s["ratios_simulation"]))
    return out


def render(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        "# Secure aggregation: FedFaaS against Flower's SecAgg+ (issue 41)",
        "",
        run_header(result["run"]),
        "",
        f"{cfg['clients']} clients, {cfg['update_bytes'] / 1e6:.1f} MB float32 updates "
        f"({cfg['model']}); SecAgg+ on both: {json.dumps(cfg['parameters'])}. "
        f"Server side of each system in its own cgroup on CPUs {cfg['cpus']}, clients in "
        "another; runs interleaved; each cell median [min-max] over the runs that finished. "
        "Target: FedFaaS's round at least 3x faster than Flower's. A dropped client never "
        "answers the unmask stage: Flower waits out its unmask `timeout` "
        f"({cfg['parameters']['fedfaas']['stage_timeout_s']:.0f} s, FedFaaS's "
        "`stage_timeout_s` the same) and unmasks without it; FedFaaS sends the root the "
        "material once the shares in hand rebuild every seed, so it waits only when they do "
        "not. Bytes: HTTP "
        "bodies (FedFaaS) and message records (Flower) from the round's start; the model the "
        "clients start from is not in them (Flower's clients get an empty one, FedFaaS's fetch "
        "theirs before the round).",
        "",
        *_simulation_note(result),
        *_fewer_clients_note(result),
    ]
    for label, block in result["dropouts"].items():
        s = block["summary"]
        systems = _systems(s)
        names = [_named(k, s[k].get("clients")) for k in systems]
        ok = ", ".join(
            f"{n} {s[k]['ok']}/{s[k]['runs']}" for k, n in zip(systems, names, strict=True)
        )
        lines += [f"## {label}", ""]
        own = block.get("run")  # a setting kept by --merge from an earlier invocation
        if own and own.get("started") != result["run"].get("started"):
            lines += [run_header(own), ""]
        pairs = _ratio_columns(s, cfg)
        lines += [f"Runs finished: {ok}.", "",
                  f"| figure | {' | '.join(names)} | {' | '.join(t for t, _ in pairs)} |",
                  "|---|" + "---|" * (len(systems) + len(pairs))]  # fmt: skip
        for name, key, scale, word in ROWS:
            cells = " | ".join(_cell(s[k].get(key), scale) for k in systems)
            ratios = " | ".join(_ratio_cell(r.get(key), word) for _, r in pairs)
            lines.append(f"| {name} | {cells} | {ratios} |")
        for system in systems:
            for f in (s.get(system) or {}).get("failures") or []:
                lines.append(f"\n{system} failed: {f}")
        lines.append("")
        for title, r in pairs:
            met = (r.get("round_s") or 0) >= 3.0
            lines.append(f"3x target, {title}: {'met' if met else 'MISSED'} "
                         f"({(r.get('round_s') or 0):.2f}x).")  # fmt: skip
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["dropouts"])
    systems = _systems(next(iter(result["dropouts"].values()))["summary"])
    width = 0.8 / len(systems)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for ax, (title, key, scale) in zip(
        axes,
        (("round time (s)", "round_s", 1.0), ("server peak (GB)", "server_peak_bytes", 1e9),
         ("server CPU-s", "server_cpu_s", 1.0)),
        strict=True,
    ):  # fmt: skip
        for i, system in enumerate(systems):
            xs, ys, lo, hi = [], [], [], []
            for j, label in enumerate(labels):
                s = (result["dropouts"][label]["summary"].get(system) or {}).get(key)
                if s:
                    xs.append(j + width * i)
                    ys.append(s["median"] / scale)
                    lo.append((s["median"] - s["min"]) / scale)
                    hi.append((s["max"] - s["median"]) / scale)
            n = (result["dropouts"][labels[0]]["summary"].get(system) or {}).get("clients")
            ax.bar(xs, ys, width * 0.95, yerr=[lo, hi], label=_named(system, n), capsize=3)
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(labels))],
                      labels, fontsize=7)  # fmt: skip
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------ running
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--flower-clients", type=int, default=10,
                    help="Flower's clients (and FedFaaS's beside them; at most --clients): "
                    "20 of Flower's SecAgg+ clients do not fit 24 GB beside its server")  # fmt: skip
    ap.add_argument("--drop", type=int, default=2, help="clients dropped in the dropout rows")
    ap.add_argument("--dropouts", default="0,drop", help="the settings to run: 0 and/or drop")
    ap.add_argument("--mb", type=float, default=None, help="update size in MB (default ResNet-18)")
    ap.add_argument("--neighbours", type=int, default=8, help="each client's neighbours")
    ap.add_argument("--stage-timeout", type=float, default=30.0, help="s a stage waits")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpus", default="0-1", help="the server sides' CPUs (cpuset syntax)")
    ap.add_argument("--timeout", type=float, default=900.0, help="s one round may take")
    ap.add_argument("--no-flower-simulation", dest="flower_simulation", action="store_false",
                    help="leave out Flower's Simulation Runtime at --clients")  # fmt: skip
    ap.add_argument("--merge", action="store_true", help="keep the stored other settings")
    ap.add_argument("--from-json", action="store_true", help="re-render the stored result")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.from_json:
        print(rerender(NAME, render, plot, args.out))
        return 0
    stop_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with pinned_threads(1) as threads:
        run = run_info("bench.secagg", sys.argv[1:] if argv is None else argv)
        run["threads"] = threads
        return _run(args, run)


def _run(args: argparse.Namespace, run: dict[str, Any]) -> int:
    from bench.harness.compare import run_compare

    layout = rc.resnet18_layout()
    if args.mb is not None:
        layout = rc.scaled_layout(layout, int(args.mb * 1e6))
    layout = [(n, list(s)) for n, s in layout]
    stored = args.out / f"{NAME}.json"
    res: dict[str, Any] = (
        json.loads(stored.read_text()) if args.merge and stored.exists() else {"dropouts": {}}
    )
    small = flower_clients(args)
    old = res.get("config") or {}
    size = (args.clients, small, rc.layout_bytes(layout))
    if (old.get("clients"), old.get("flower_clients") or old.get("clients"),
            old.get("update_bytes")) != size:  # fmt: skip
        res["dropouts"] = {}  # a stored run of another size is not merged with this one
    res["run"] = run
    res["config"] = {
        "clients": args.clients,
        "flower_clients": small,
        "update_bytes": rc.layout_bytes(layout),
        "model": "resnet18 (10 classes)" if args.mb is None else f"scaled to {args.mb} MB",
        "cpus": args.cpus,
        "repeats": args.repeats,
        "parameters": parameters(small, args.neighbours, args.stage_timeout),
        "flower_simulation": args.flower_simulation,
    }
    for setting in args.dropouts.split(","):
        n_drop = 0 if setting == "0" else args.drop
        drops = dropped(args.clients, small, n_drop)
        label = f"{100 * n_drop / args.clients:.0f}% dropout ({n_drop} of {args.clients}"
        label += f"; {len(drops[small])} of {small})" if small != args.clients else ")"

        def keep(cmp: dict[str, Any], label: str = label, drop: list[int] = drops[small]) -> None:
            res["dropouts"][label] = {
                "dropped": drop, "compare": cmp, "summary": summary(cmp), "run": run,
            }  # fmt: skip
            write_result(res, "secagg", render, args.out)

        keep(run_compare(runners(args, layout, drops), cpus_sets=[args.cpus],
                         repeats=args.repeats, after_run=keep))  # fmt: skip
    stored_res, md = write_result(res, "secagg", render, args.out)
    plot(stored_res, args.out / f"{NAME}.png")
    print(md)
    return 0


def dropped(clients: int, small: int, n_drop: int) -> dict[int, list[int]]:
    """The clients dropped at each size: the last ``n_drop`` of ``clients``, and the same
    share (rounded, at least one when any) of ``small``."""
    n_small = max(1, round(n_drop * small / clients)) if n_drop else 0
    return {clients: list(range(clients - n_drop, clients)),
            small: list(range(small - n_small, small))}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
