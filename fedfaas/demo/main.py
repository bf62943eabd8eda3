"""The demo run: platform up, job on the control plane, clients, FLStore's answers, report,
platform down."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fedfaas.demo.config import DemoConfig, DemoResult
from fedfaas.demo.flstore import three_questions
from fedfaas.demo.report import fedavg_error, plot, report, say
from fedfaas.demo.stack import Running, platform

log = logging.getLogger(__name__)

#: The validation-set evaluator the job declares: FLStore scores contributions with it.
EVALUATOR = {"kind": "function", "function": "digits-evaluator"}  # stack.yml deploys it


class DemoError(RuntimeError):
    """The demo could not do what it shows (the message says what and where to look)."""


def _train(cfg: DemoConfig, p: Running, result: DemoResult) -> None:
    """Create the job on the control plane and train the clients; fills ``result.rounds``."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from client.data import federated_digits
    from client.model import make_model, model_to_bytes
    from client.sdk import submit_job
    from client.simulator import Simulator, SimulatorConfig, control_plane_assignment

    data = federated_digits(cfg.clients, alpha=cfg.alpha, seed=cfg.seed)
    ids = [c.client_id for c in data.clients]
    if cfg.malicious is not None and cfg.malicious not in ids:
        raise DemoError(f"malicious client {cfg.malicious!r} is not one of {ids[0]}..{ids[-1]}")
    cp = p.urls["control_plane"]
    mode: dict[str, Any] = {}
    if cfg.mode == "async":  # every client trains at once; buffers of cfg.buffer updates
        mode = {"goal": cfg.buffer, "overprovision": cfg.clients / cfg.buffer, "fedbuff": {}}
    created = submit_job(
        cp,
        cfg.job,
        model_to_bytes(make_model(cfg.seed, cfg.model)),
        rounds=cfg.versions,
        clients=ids,
        admin_token=p.admin_secret(),
        evaluator=EVALUATOR,
        ca_file=p.ca_file,
        **mode,
    )
    tokens: dict[str, str] = created["tokens"]  # the job's salt is in them: good for it only
    assign = control_plane_assignment(cp, cfg.job, tokens, ca_file=p.ca_file)
    for c in ids:
        url = assign(c)
        result.placement[url] = result.placement.get(url, 0) + 1
    nodes = {url: node for node, url in p.gateways.items()}
    say(
        f"job {cfg.job!r} on the control plane: {cfg.clients} clients placed "
        + ", ".join(f"{n} {nodes.get(u, u)}" for u, n in result.placement.items())
        + f" (round 1), {cfg.rounds} rounds, Dirichlet alpha {cfg.alpha}, model {cfg.model}"
        + (f"; {cfg.malicious} sign-flips its update" if cfg.malicious else "")
        + (
            f"; async (FedBuff): {cfg.versions} versions of {cfg.buffer} updates, "
            f"{len(cfg.slow_clients(ids))} clients 5x slower"
            if cfg.mode == "async"
            else ""
        )
    )
    samples = {c.client_id: c.num_samples for c in data.clients}
    updates: dict[tuple[int, str], bytes] = {}
    checks: dict[int, float] = {}
    tty = sys.stderr.isatty()
    bar_rounds = tqdm(total=cfg.versions, desc="rounds ", unit="round", position=0, leave=True)
    bar_up = tqdm(
        total=cfg.clients if cfg.mode == "sync" else cfg.buffer,
        desc="round 1",
        unit="update",
        position=1,
        leave=False,
        disable=not tty,
    )  # two live bars only make sense on a terminal

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if kind == "upload":
            updates[info["round"], info["client"]] = info["data"]
            bar_up.update(1)
        elif kind == "round":
            rnd = info["round"]
            if cfg.mode == "sync":  # an async version is no FedAvg of its buffer
                checks[rnd] = fedavg_error(
                    info["global_model"],
                    [(blob, samples[cid]) for (r, cid), blob in updates.items() if r == rnd],
                )
            bar_rounds.update(1)
            bar_rounds.set_postfix(accuracy=f"{info['accuracy']:.3f}")
            if rnd < cfg.versions:
                bar_up.reset()
                bar_up.set_description(f"round {rnd + 1}")

    malicious = {cfg.malicious: "sign-flip"} if cfg.malicious else {}
    sim_cfg = SimulatorConfig(
        rounds=cfg.versions,
        workers=cfg.workers,
        seed=cfg.seed,
        model=cfg.model,
        malicious=malicious,
        slow=cfg.slow_clients(ids),
        ca_file=p.ca_file,
    )
    try:
        # Log lines go through tqdm.write so they do not tear the live bars apart.
        with (
            logging_redirect_tqdm(),
            Simulator(cfg.job, data, tokens, assign, sim_cfg, on_event=on_event) as sim,
        ):
            reports = sim.run() if cfg.mode == "sync" else sim.run_async()
    finally:
        bar_up.close()
        bar_rounds.close()
    result.rounds = [{**asdict(r), "fedavg_max_rel_err": checks.get(r.round)} for r in reports]


def wait_for_checkpoints(
    p: Running, job: str, rounds: int, result: DemoResult, wait: float = 30.0
) -> None:
    """Wait until the gateways' checkpoints of rounds 0..``rounds`` are in MinIO (each round's
    ``meta.json`` is written last); raise :class:`DemoError` if one is missing after ``wait``."""
    from core.checkpoints import CheckpointNotFound, CheckpointReader

    endpoint, user, password = p.minio()
    reader = CheckpointReader(endpoint, user, password)
    result.minio_user = user
    missing = list(range(rounds + 1))
    deadline = time.monotonic() + wait
    while missing:
        for rnd in list(missing):
            with contextlib.suppress(CheckpointNotFound):
                reader.get_meta(job, rnd)
                missing.remove(rnd)
        if missing and time.monotonic() > deadline:
            raise DemoError(
                f"rounds {missing} of {job!r} have no checkpoint in MinIO after {wait:.0f}s; "
                f"see the gateway logs in {p.state_dir / 'logs'}"
            )
        if missing:
            time.sleep(0.25)
    result.checkpoint_keys = [
        f"{job}/rounds/{rnd:06d}/global.safetensors" for rnd in range(rounds + 1)
    ]


@contextlib.contextmanager
def _sigterm_stops_cleanly() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the platform is stopped as after Ctrl-C."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _phase(result: DemoResult, name: str, t0: float) -> float:
    now = time.perf_counter()
    result.timings[name] = now - t0
    return now


def run(state_dir: Path, config: DemoConfig | None = None) -> int:
    """Run the demo with the platform under ``state_dir/demo/platform`` and the report in
    ``state_dir/demo``; returns the exit code.

    0 when every round completed, the last global model is well above chance
    (``config.min_accuracy``), FLStore answered all three questions and flagged the planted
    malicious client.
    """
    cfg = config or DemoConfig.from_env()
    out = Path(state_dir).resolve() / "demo"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("demo.png", "demo.json"):
        (out / name).unlink(missing_ok=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = DemoResult()
    t_start = t = time.perf_counter()
    say(f"FedFaaS demo: `fedfaas up --with all` in {out / 'platform'}")
    try:
        with _sigterm_stops_cleanly(), platform(out / "platform", **cfg.platform) as p:
            t = _phase(result, "platform_up_s", t)
            result.urls, result.platform_id = dict(p.urls), p.platform_id
            say(
                "platform: "
                + ", ".join(
                    f"{k} {p.urls[k]}"
                    for k in ("control_plane", "gateway", "gateway_node1", "request_tracker")
                )
            )
            before = p.tasks_done()
            _train(cfg, p, result)
            t = _phase(result, "training_s", t)
            _record_aggregation(p, before, result)
            wait_for_checkpoints(p, cfg.job, cfg.versions, result)
            t = _phase(result, "checkpoints_s", t)
            say("asking FLStore (request tracker) three questions about the job ...")
            result.answers = three_questions(
                p.urls["request_tracker"],
                cfg.job,
                cfg.versions,
                cfg.select,
                cfg.malicious,
                p.analyst_token(),
                p.ca_file,
            )
            t = _phase(result, "flstore_s", t)
            result.seconds = t - t_start
            _write(cfg, result, out, report_too=True)  # while MinIO and its console still run
            if cfg.hold > 0:
                say(f"holding the platform for {cfg.hold:.0f} s (Ctrl-C to stop now)")
                with contextlib.suppress(KeyboardInterrupt):
                    time.sleep(cfg.hold)
                t = time.perf_counter()
        t = _phase(result, "platform_down_s", t)
        result.seconds = t - t_start
        say(
            f"platform stopped in {result.timings['platform_down_s']:.1f} s; "
            f"demo total {result.seconds:.1f} s"
        )
        _write(cfg, result, out, report_too=False)
    except Exception as exc:  # noqa: BLE001 - report it; the platform is already down
        log.exception("demo failed")
        result.error = f"{type(exc).__name__}: {exc}"
        result.seconds = time.perf_counter() - t_start
        say(f"demo failed: {result.error}")
        _write(cfg, result, out, report_too=bool(result.rounds))
    result.problems = _problems(cfg, result)
    for msg in result.problems:
        say(f"NOT OK: {msg}")
    if result.problems:
        _write(cfg, result, out, report_too=False)
    return 1 if result.problems else 0


def _write(cfg: DemoConfig, result: DemoResult, out: Path, report_too: bool) -> None:
    """``demo.json`` always; the plot and the printed report when asked."""
    (out / "demo.json").write_text(
        json.dumps({"config": asdict(cfg), **asdict(result)}, indent=1) + "\n"
    )
    if report_too and result.rounds:
        plot(cfg, result, out / "demo.png")
        report(cfg, result, out)


def _record_aggregation(p: Running, before: dict[int, int], result: DemoResult) -> None:
    """Which ``aggregator`` replicas ran the job's aggregation tasks (their own counters)."""
    after = p.tasks_done()
    replicas = {int(r["pid"]): r for r in p.replicas()}
    endpoints = p.endpoint_pids()
    result.aggregation = {
        "function": "aggregator",
        "replicas": [
            {
                "pid": pid,
                "node": next((n for n, pids in endpoints.items() if pid in pids), None),
                "tasks": after.get(pid, 0) - before.get(pid, 0),
            }
            for pid in sorted(replicas)
        ],
        "tasks": sum(after.get(pid, 0) - before.get(pid, 0) for pid in after),
        "endpoints_all_replicas": all(pids <= set(replicas) for pids in endpoints.values()),
    }


def _problems(cfg: DemoConfig, result: DemoResult) -> list[str]:
    if result.error:
        return [result.error]
    out = []
    if cfg.mode == "sync" and len(result.rounds) != cfg.rounds:
        out.append(f"{len(result.rounds)} of {cfg.rounds} rounds completed")
    elif not result.rounds or result.rounds[-1]["version"] != cfg.versions:
        out.append(f"version {cfg.versions} was not published")
    elif result.rounds[-1]["accuracy"] < cfg.min_accuracy:
        out.append(f"final accuracy {result.rounds[-1]['accuracy']:.3f} < {cfg.min_accuracy}")
    if not result.aggregation.get("tasks"):
        out.append("no aggregation task ran in an aggregator replica")
    a = result.answers
    if cfg.malicious is not None and not a.get("malicious", {}).get("found"):
        out.append(f"FLStore did not flag {cfg.malicious} (flagged: {a.get('malicious')})")
    if len(a.get("oort", {}).get("selected", [])) != cfg.select:
        out.append(f"Oort did not select {cfg.select} clients")
    return out
