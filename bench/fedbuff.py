"""Sync FedAvg against async FedBuff on the digits task when a third of the clients are 5x
slower (issue 14): ``make bench-fedbuff`` (``python -m bench.fedbuff``).

Both jobs run in the same run, on one platform that ``fedfaas up --with all`` starts (the
demo's, :func:`fedfaas.demo.stack.platform`), through the control plane and the SDK, with
the same 20 clients, data split, model, local training and slow clients (every third client
sleeps 4 times its training time after training: 5x slower), torch pinned to one thread per
client. The sync job waits for every client each round; the async one (``fedbuff={}``)
applies a buffer of 5 updates at a time with staleness weights. The figure of merit: the
wall time from the first training to the first model whose test accuracy reaches the sync
job's final accuracy (both measured by the same evaluation, as each model is published).

The pair is run ``--repeats`` times (default :data:`bench.harness.compare.REPEATS`), the modes
alternating (sync, async, sync, ...), each repeat's target its own sync job's final accuracy;
the table gives each mode's median [min-max] time to the target and the ratio of the medians.

Writes ``bench/results/async.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.compare import REPEATS, spread
from bench.runinfo import pinned_threads, run_info, stop_on_sigterm, write_result

RESULTS = Path(__file__).resolve().parent / "results"
CLIENTS, ROUNDS, BUFFER, SLOW = 20, 5, 5, 5.0


def _job(p: Any, mode: str, rounds: int, repeat: int = 0) -> list[dict[str, Any]]:
    from client.data import federated_digits
    from client.model import make_model, model_to_bytes
    from client.sdk import submit_job
    from client.simulator import Simulator, SimulatorConfig, control_plane_assignment

    data = federated_digits(CLIENTS, alpha=0.5, seed=0)
    ids = [c.client_id for c in data.clients]
    extra: dict[str, Any] = {}
    versions = rounds
    if mode == "async":
        extra = {"goal": BUFFER, "overprovision": CLIENTS / BUFFER, "fedbuff": {}}
        versions = rounds * CLIENTS // BUFFER  # the same number of updates at most
    cp = p.urls["control_plane"]
    job = f"bench-{mode}-{repeat}"
    created = submit_job(
        cp,
        job,
        model_to_bytes(make_model(0, "softmax")),
        rounds=versions,
        clients=ids,
        admin_token=p.admin_secret(),
        ca_file=p.ca_file,  # the platform serves TLS (fedfaas up's default)
        **extra,
    )
    assign = control_plane_assignment(cp, job, created["tokens"], ca_file=p.ca_file)
    cfg = SimulatorConfig(
        rounds=versions,
        workers=CLIENTS,  # every client trains at once in both modes
        seed=0,
        model="softmax",
        slow={c: SLOW for c in ids[2::3]},
        torch_threads=1,
        # a version takes a second or two here: a job that publishes none for a minute is
        # stuck, and says so (each node's round, each client's state) well within a CI
        # test's timeout
        round_timeout=60.0,
        ca_file=p.ca_file,
    )
    with Simulator(job, data, created["tokens"], assign, cfg) as sim:
        t0 = time.perf_counter()
        reports = sim.run() if mode == "sync" else sim.run_async()
        total = time.perf_counter() - t0
    out, elapsed = [], 0.0
    for r in reports:
        elapsed = r.seconds if mode == "async" else elapsed + r.seconds
        out.append({"version": r.version, "accuracy": r.accuracy, "seconds": elapsed})
    out[-1]["total_s"] = total
    return out


def _first_reaching(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((pt for pt in curve if pt["accuracy"] >= target - 1e-12), None)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the repeats: each mode's time to its repeat's target (:func:`spread` over the
    repeats that reached it), how many reached it, and sync's median over async's."""
    out: dict[str, Any] = {}
    for mode in ("sync", "async"):
        hits = [r[mode]["reached"] for r in runs]
        out[mode] = {
            "seconds": spread([h["seconds"] if h else None for h in hits]),
            "reached": sum(h is not None for h in hits),
            "models": spread([len(r[mode]["curve"]) for r in runs]),
        }
    s, a = out["sync"]["seconds"], out["async"]["seconds"]
    out["speedup_of_medians"] = s["median"] / a["median"] if s and a else None
    out["targets"] = spread([r["target_accuracy"] for r in runs])
    return out


def run(out_dir: Path, repeats: int = REPEATS) -> dict[str, Any]:
    from fedfaas.demo.stack import platform

    info = run_info("bench.fedbuff")
    result: dict[str, Any] = {
        "run": info,
        "setup": {
            "clients": CLIENTS,
            "slow_clients": len(range(2, CLIENTS, 3)),
            "slowdown": SLOW,
            "sync_rounds": ROUNDS,
            "async_buffer": BUFFER,
            "async_max_versions": ROUNDS * CLIENTS // BUFFER,
            "model": "softmax",
            "staleness": "poly a=0.5 (1/sqrt(1+s)), max_staleness 4, eta 1",
        },
        "repeats": repeats,
        "order": "interleaved: sync, async, then again",
        "runs": [],
    }
    with (
        pinned_threads(1) as threads,
        tempfile.TemporaryDirectory(prefix="fedfaas-bench-async-") as tmp,
        platform(Path(tmp) / "platform") as p,
    ):
        result["run"]["threads"] = threads
        for rep in range(repeats):
            sync = _job(p, "sync", ROUNDS, rep)
            asyn = _job(p, "async", ROUNDS, rep)
            target = sync[-1]["accuracy"]
            result["runs"].append({
                "repeat": rep,
                "target_accuracy": target,
                "sync": {"curve": sync, "reached": _first_reaching(sync, target)},
                "async": {"curve": asyn, "reached": _first_reaching(asyn, target)},
            })  # fmt: skip
            result["summary"] = summary(result["runs"])
            write_result(result, "async", render, out_dir)  # a run cut short keeps what it did
    _plot(result, out_dir / "async.png")
    return result


def _cell(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])} [{f.format(s['min'])}-{f.format(s['max'])}]"


def render(res: dict[str, Any]) -> str:
    setup, summ, n = res["setup"], res["summary"], len(res["runs"])
    lines = [
        "# Async FedBuff against sync FedAvg, a third of the clients 5x slower",
        "",
        f"Digits, {setup['clients']} clients ({setup['slow_clients']} of them "
        f"{setup['slowdown']:.0f}x slower), model {setup['model']}, one platform "
        "(`fedfaas up --with all`), control plane and SDK for both jobs, same run. "
        f"Async: buffers of {setup['async_buffer']}, {setup['staleness']}. Target: each "
        f"repeat's sync job's accuracy after {setup['sync_rounds']} rounds "
        f"({_cell(summ['targets'], 3)}). {n} repeats, {res['order']}; median [min-max] over "
        "the repeats that reached the target.",
        "",
        "| mode | repeats reaching the target | wall time to the target (s) | models published |",
        "| --- | ---: | ---: | ---: |",
    ]
    for mode in ("sync", "async"):
        m = summ[mode]
        lines.append(
            f"| {mode} | {m['reached']}/{n} | {_cell(m['seconds'])} | {_cell(m['models'], 0)} |"
        )
    sp = summ["speedup_of_medians"]
    lines += [
        "",
        f"Time to the target, sync / async (ratio of medians): **{sp:.2f}x**"
        if sp
        else _no_ratio(res),
        "",
        f"Command: `{res['run']['command']}`; commit {res['run']['commit']['sha']}.",
    ]
    return "\n".join(lines) + "\n"


def _no_ratio(res: dict[str, Any]) -> str:
    """The sentence in place of the ratio when a mode reached the target in no repeat: which
    mode, and how near its best model came (median [min-max] over the repeats)."""
    n = len(res["runs"])
    missed = [m for m in ("sync", "async") if not res["summary"][m]["reached"]]
    best = {}
    for m in missed:
        peaks = [max(p["accuracy"] for p in r[m]["curve"]) for r in res["runs"] if r[m]["curve"]]
        best[m] = _cell(spread(peaks), 3)
    said = "; ".join(
        f"{m} reached the target in 0 of {n} repeats (its best accuracy {best[m]})" for m in missed
    )
    return f"No ratio: {said}."


def _plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, colour in (("sync", "tab:blue"), ("async", "tab:orange")):
        for r in res["runs"]:
            c = r[name]["curve"]
            ax.plot([p["seconds"] for p in c], [p["accuracy"] for p in c], marker="o",
                    color=colour, alpha=0.5, label=name if r["repeat"] == 0 else None)  # fmt: skip
    target = res["summary"]["targets"]["median"]
    ax.axhline(target, color="grey", ls="--", lw=1, label="target (sync final, median)")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits, 1/3 of clients 5x slower")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="sync/async pairs, alternating")
    args = ap.parse_args(argv)
    stop_on_sigterm()  # a SIGTERM still takes the platform down
    logging.basicConfig(level=logging.WARNING)
    res = run(args.out, args.repeats)
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
