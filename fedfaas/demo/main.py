"""The demo run: platform up, job, clients, checkpoints, report, everything stopped."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from fedfaas.demo.config import DemoConfig, DemoResult
from fedfaas.demo.procs import (
    AGGREGATOR_DIR,
    REPO,
    Child,
    deploy_aggregator,
    job_on,
    remove_functions,
    start_gateways,
    start_runtime,
    stop_all,
)
from fedfaas.demo.report import fedavg_error, plot, report, say
from fedfaas.services import MinioServer, RedisServer, ServiceError

log = logging.getLogger(__name__)


def _train(
    cfg: DemoConfig,
    urls: dict[str, str],
    admin: str,
    base: Path,
    runtime: str | None,
    result: DemoResult,
    cleanup: list[Callable[[], None]],
) -> tuple[Any, dict[str, Any]]:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from client.data import federated_digits
    from client.model import make_model, model_to_bytes
    from client.sdk import create_job
    from client.simulator import Simulator, SimulatorConfig, assignment_from_plan

    names = list(urls)
    data = federated_digits(cfg.clients, alpha=cfg.alpha, seed=cfg.seed)
    ids = [c.client_id for c in data.clients]
    job = create_job(
        urls[names[0]],
        admin,
        cfg.job,
        model_to_bytes(make_model(cfg.seed)),
        rounds=cfg.rounds,
        goal=cfg.clients,
        clients=ids,
        nodes=names,
    )
    client_nodes = job.client_nodes() or {c: names[i % len(names)] for i, c in enumerate(ids)}
    per_node = {n: sum(1 for v in client_nodes.values() if v == n) for n in names}
    say(
        f"job {cfg.job!r}: {cfg.clients} clients over nodes {per_node}, goal {cfg.clients}, "
        f"{cfg.rounds} rounds, Dirichlet alpha {cfg.alpha}"
    )
    if runtime is not None:
        fn_names = []
        try:
            for n in names:
                st = job_on(urls[n], cfg.job, 30)
                env = {
                    "FEDFAAS_GATEWAY_SOCKET": str(base / f"gateway-{n}" / f"router-{n}.sock"),
                    "FEDFAAS_AGGREGATOR_JOB_ID": str(st["id"]),
                    "FEDFAAS_AGGREGATOR_STORE": str(st["store"]),
                    "FEDFAAS_AGGREGATOR_ENDPOINTS": str(cfg.endpoints_per_node),
                }
                fn = f"aggregator-{cfg.job}-{n}"
                fn_names.append(fn)
                deploy_aggregator(runtime, fn, env, 90)
            result.aggregators = (
                f"aggregator function on the embedded runtime: {fn_names} "
                f"({cfg.endpoints_per_node} endpoints each)"
            )
            cleanup.append(lambda: remove_functions(runtime, fn_names))
        except (ServiceError, httpx.HTTPError) as exc:
            log.warning("embedded runtime could not run the aggregator (%s); using processes", exc)
            remove_functions(runtime, fn_names)
            _spawn_workers(cfg, urls, base, result, cleanup, reason=str(exc))
    elif not result.aggregators:
        _spawn_workers(cfg, urls, base, result, cleanup, reason="requested")
    updates: dict[tuple[int, str], bytes] = {}
    globals_: dict[int, bytes] = {}
    samples = {c.client_id: c.num_samples for c in data.clients}
    checks: dict[int, float] = {}
    tty = sys.stderr.isatty()
    bar_rounds = tqdm(total=cfg.rounds, desc="rounds ", unit="round", position=0, leave=True)
    bar_up = tqdm(
        total=cfg.clients, desc="round 1", unit="update", position=1, leave=False, disable=not tty
    )  # two live bars only make sense on a terminal

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if kind == "upload":
            updates[info["round"], info["client"]] = info["data"]
            bar_up.update(1)
        elif kind == "round":
            rnd = info["round"]
            globals_[rnd] = info["global_model"]
            checks[rnd] = fedavg_error(
                info["global_model"],
                [(blob, samples[cid]) for (r, cid), blob in updates.items() if r == rnd],
            )
            bar_rounds.update(1)
            bar_rounds.set_postfix(accuracy=f"{info['accuracy']:.3f}")
            if rnd < cfg.rounds:
                bar_up.reset()
                bar_up.set_description(f"round {rnd + 1}")

    assign = assignment_from_plan(client_nodes, urls)
    sim_cfg = SimulatorConfig(rounds=cfg.rounds, workers=cfg.workers, seed=cfg.seed)
    try:
        # Log lines go through tqdm.write so they do not tear the live bars apart.
        with (
            logging_redirect_tqdm(),
            Simulator(cfg.job, data, job.tokens, assign, sim_cfg, on_event=on_event) as sim,
        ):
            reports = sim.run()
    finally:
        bar_up.close()
        bar_rounds.close()
    result.rounds = [{**asdict(r), "fedavg_max_rel_err": checks.get(r.round)} for r in reports]
    return reports, {
        "updates": updates,
        "globals": globals_,
        "client_nodes": client_nodes,
        "samples": samples,
    }


def _spawn_workers(
    cfg: DemoConfig,
    urls: dict[str, str],
    base: Path,
    result: DemoResult,
    cleanup: list[Callable[[], None]],
    reason: str,
) -> None:
    kids = []
    for n, url in urls.items():
        st = job_on(url, cfg.job, 30)
        argv = [
            sys.executable,
            str(AGGREGATOR_DIR / "worker.py"),
            "--socket",
            str(base / f"gateway-{n}" / f"router-{n}.sock"),
            "--job-id",
            str(st["id"]),
            "--store",
            str(st["store"]),
            "--endpoints",
            str(cfg.endpoints_per_node),
            "--log-level",
            "WARNING",
        ]
        kids.append(Child.spawn(f"aggregator-{n}", argv, base / f"aggregator-{n}.log", cwd=REPO))
    cleanup.append(lambda: stop_all(kids))
    result.aggregators = (
        f"aggregator worker processes, {cfg.endpoints_per_node} endpoints per node ({reason})"
    )


def ensure_checkpoints(
    cfg: DemoConfig,
    minio: MinioServer,
    run: dict[str, Any],
    result: DemoResult,
    base: Path,
    wait: float = 10.0,
) -> None:
    """Check that every round's checkpoint is in MinIO; write the missing ones from ``run``.

    ``run`` holds what the clients saw: ``globals`` (round -> served model bytes), ``updates``
    ((round, client) -> uploaded bytes), ``client_nodes`` and ``samples``.
    """
    from fedfaas.checkpoints import CheckpointReader, CheckpointWriter

    reader = CheckpointReader(minio.endpoint, minio.access_key, minio.secret_key)
    want = sorted(run["globals"])
    deadline = time.monotonic() + wait  # the gateways write asynchronously; give them a moment
    while time.monotonic() < deadline:
        if all(_has_global(reader, cfg.job, r) for r in want):
            break
        time.sleep(0.5)
    missing = [r for r in want if not _has_global(reader, cfg.job, r)]
    if not missing:
        result.checkpoints_by = "the node gateways (asynchronous checkpoint writer)"
    else:
        # The gateways were started with --minio; where they did not checkpoint these rounds
        # the driver writes what it saw: the served global model and every accepted upload.
        with CheckpointWriter(
            minio.endpoint, minio.access_key, minio.secret_key, spool_dir=base / "checkpoint-spool"
        ) as w:
            for rnd in missing:
                w.put_global(cfg.job, rnd, run["globals"][rnd], {"version": rnd})
                clients = []
                for (r, cid), blob in sorted(run["updates"].items()):
                    if r == rnd:
                        w.put_client(cfg.job, rnd, cid, blob)
                        clients.append(
                            {
                                "client": cid,
                                "node": run["client_nodes"][cid],
                                "num_samples": run["samples"][cid],
                            }
                        )
                rep = next(x for x in result.rounds if x["round"] == rnd)
                w.put_meta(
                    cfg.job,
                    rnd,
                    {
                        "round": rnd,
                        "version": rep["version"],
                        "accuracy": rep["accuracy"],
                        "loss": rep["loss"],
                        "seconds": rep["seconds"],
                        "clients": clients,
                    },
                )
            if not w.flush(60):
                raise ServiceError("checkpoints did not reach MinIO within 60 s")
        result.checkpoints_by = (
            f"the demo driver for rounds {missing} (the gateways wrote "
            f"{sorted(set(want) - set(missing)) or 'none'})"
        )
    keys = []
    for rnd in reader.rounds(cfg.job):
        keys.append(f"{cfg.job}/rounds/{rnd:06d}/global.safetensors")
    result.checkpoint_keys = keys


def _has_global(reader: Any, job: str, rnd: int) -> bool:
    from fedfaas.checkpoints import CheckpointNotFound

    try:
        reader.global_meta(job, rnd)
        return True
    except CheckpointNotFound:
        return False


def run(state_dir: Path, config: DemoConfig | None = None) -> int:
    """Run the demo with its state under ``state_dir/demo``; returns the exit code.

    0 when every round completed and the last global model is well above chance
    (``config.min_accuracy``, 50% by default).
    """
    cfg = config or DemoConfig.from_env()
    base = Path(state_dir).resolve() / "demo"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = DemoResult()
    shm_root = Path("/dev/shm") / f"fedfaas-demo-{secrets.token_hex(4)}"
    cleanup: list[Callable[[], None]] = []
    children: list[Child] = []
    redis = minio = None
    t0 = time.perf_counter()
    try:
        say(f"FedFaaS demo: state in {base}")
        redis = RedisServer(data_dir=base / "redis").start()
        minio = MinioServer(data_dir=base / "minio").start()
        result.minio_url, result.console_url = minio.url, minio.console_url
        result.minio_data = str(base / "minio" / "data")
        say(f"redis {redis.url}; minio {minio.url} (console {minio.console_url})")
        runtime_url = None
        if cfg.aggregators == "runtime":
            try:
                runtime_url, rt = start_runtime(base)
                children.append(rt)
                say(f"embedded runtime {runtime_url}")
            except (ServiceError, OSError) as exc:
                log.warning("embedded runtime did not start (%s); using processes", exc)
        names = [chr(ord("a") + i) for i in range(cfg.nodes)]
        urls, gws = start_gateways(base, names, redis.url, minio, shm_root, spawn=0)
        children.extend(gws)
        result.nodes = urls
        say("node gateways: " + ", ".join(f"{n} {u}" for n, u in urls.items()))
        admin = (base / "admin-token").read_text().strip()
        _, run_data = _train(cfg, urls, admin, base, runtime_url, result, cleanup)
        ensure_checkpoints(cfg, minio, run_data, result, base)
        result.seconds = time.perf_counter() - t0
        plot(result, base / "demo.png")
        (base / "demo.json").write_text(
            json.dumps({"config": asdict(cfg), **asdict(result)}, indent=1) + "\n"
        )
        report(cfg, result, minio, base)
        if cfg.hold > 0:
            say(f"holding MinIO for {cfg.hold:.0f} s (Ctrl-C to stop now)")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(cfg.hold)
    except Exception as exc:  # noqa: BLE001 - report, then stop everything below
        log.exception("demo failed")
        say(f"demo failed: {exc}")
        return 1
    finally:
        for fn in reversed(cleanup):
            with contextlib.suppress(Exception):
                fn()
        stop_all(list(reversed(children)))
        for svc in (minio, redis):
            if svc is not None:
                svc.stop()
        _remove_empty_tree(shm_root)
    ok = len(result.rounds) == cfg.rounds and result.rounds[-1]["accuracy"] >= cfg.min_accuracy
    if not ok:
        say(
            f"demo finished, but the final accuracy is below {cfg.min_accuracy:.0%} or rounds "
            "are missing"
        )
    return 0 if ok else 1


def _remove_empty_tree(root: Path) -> None:
    if not root.exists():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()
    if root.exists():
        log.warning("shared-memory folder %s not empty after the demo", root)
