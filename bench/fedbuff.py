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

Writes ``bench/results/async.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.runinfo import pinned_threads, run_info, write_result

RESULTS = Path(__file__).resolve().parent / "results"
CLIENTS, ROUNDS, BUFFER, SLOW = 20, 5, 5, 5.0


def _job(p: Any, mode: str, rounds: int) -> list[dict[str, Any]]:
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
    job = f"bench-{mode}"
    created = submit_job(
        cp,
        job,
        model_to_bytes(make_model(0, "softmax")),
        rounds=versions,
        clients=ids,
        admin_token=p.admin_secret(),
        **extra,
    )
    assign = control_plane_assignment(cp, job, created["tokens"])
    cfg = SimulatorConfig(
        rounds=versions,
        workers=CLIENTS,  # every client trains at once in both modes
        seed=0,
        model="softmax",
        slow={c: SLOW for c in ids[2::3]},
        torch_threads=1,
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


def run(out_dir: Path) -> dict[str, Any]:
    from fedfaas.demo.stack import platform

    info = run_info("bench.fedbuff")
    with (
        pinned_threads(1) as threads,
        tempfile.TemporaryDirectory(prefix="fedfaas-bench-async-") as tmp,
        platform(Path(tmp) / "platform") as p,
    ):
        sync = _job(p, "sync", ROUNDS)
        asyn = _job(p, "async", ROUNDS)
    target = sync[-1]["accuracy"]
    hit_sync, hit_async = _first_reaching(sync, target), _first_reaching(asyn, target)
    result = {
        "run": {**info, "threads": threads},
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
        "target_accuracy": target,
        "sync": {"curve": sync, "reached": hit_sync},
        "async": {"curve": asyn, "reached": hit_async},
        "speedup": None
        if hit_async is None or hit_sync is None
        else hit_sync["seconds"] / hit_async["seconds"],
    }
    write_result(result, "async", render, out_dir)
    _plot(result, out_dir / "async.png")
    return result


def render(res: dict[str, Any]) -> str:
    s, a = res["sync"]["reached"], res["async"]["reached"]
    setup = res["setup"]
    lines = [
        "# Async FedBuff against sync FedAvg, a third of the clients 5x slower",
        "",
        f"Digits, {setup['clients']} clients ({setup['slow_clients']} of them "
        f"{setup['slowdown']:.0f}x slower), model {setup['model']}, one platform "
        "(`fedfaas up --with all`), control plane and SDK for both jobs, same run. "
        f"Async: buffers of {setup['async_buffer']}, {setup['staleness']}. Target: the sync "
        f"job's accuracy after {setup['sync_rounds']} rounds, "
        f"**{res['target_accuracy']:.3f}**.",
        "",
        "| mode | first model at the target | accuracy | wall time (s) | models published |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, hit in (("sync", s), ("async", a)):
        curve = res[name]["curve"]
        if hit is None:
            lines.append(
                f"| {name} | not reached | {curve[-1]['accuracy']:.3f} | - | {len(curve)} |"
            )
        else:
            lines.append(
                f"| {name} | v{hit['version']} | {hit['accuracy']:.3f} | {hit['seconds']:.2f} "
                f"| {len(curve)} |"
            )
    sp = res["speedup"]
    lines += [
        "",
        f"Time to the target, sync / async: **{sp:.2f}x**" if sp else "Async missed the target.",
        "",
        f"Command: `{res['run']['command']}`; commit {res['run']['commit']['sha']}.",
    ]
    return "\n".join(lines) + "\n"


def _plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("sync", "async"):
        c = res[name]["curve"]
        ax.plot([p["seconds"] for p in c], [p["accuracy"] for p in c], marker="o", label=name)
    ax.axhline(res["target_accuracy"], color="grey", ls="--", lw=1, label="target (sync final)")
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    res = run(args.out)
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
