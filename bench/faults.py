"""The fault campaign (issues 13 and 35): real faults injected into the platform a user
starts, while a round is in flight, repeated; nothing acknowledged may be lost or counted
twice, and each fault must be shown to have hit the work it names.

    make test-faults                       # every fault, 3 runs each
    python -m bench.faults --runs 5 --faults replica,root-gateway

A run of some faults (``--faults``) merges its rows into the stored results: the rows it ran
are replaced, every other row is kept with the record of the run that made it, and the table
names each row's commit (:func:`bench.fault_table.merge_results`).

Each fault gets a fresh ``fedfaas up --with all`` (:func:`fedfaas.demo.stack.platform`, the
demo's own platform, supervisor included) and ``--runs`` jobs on it, on ``up``'s default, TLS:
the platform users get. The clients (the SDK) verify the parts against the platform's CA
(``ca_file``), as a user's do; the harness's own calls (:mod:`bench.fault_platform`,
:mod:`bench.fault_kinds`, :mod:`bench.fault_checks`) verify it too and present ``fedfaas``'s
certificate, which the cache engine requires; fault (l)'s broken-off uploads end with TLS's
``close_notify`` (:mod:`bench.fault_disconnect`). A job: ``CLIENTS``
clients on both node gateways, ``ROUNDS`` rounds, every client uploading each round through
the SDK (:class:`client.sdk.FLClient`, ``UPLOADERS`` at a time) an update of ResNet-18's
layout (44.8 MB; FLStore's faults, whose queries load every update, use 257 KiB). The fault
(:mod:`bench.fault_kinds`) is injected once per job, after a random number of acknowledged
uploads of a random round (or at the share its row asks for; FLStore's faults: at a random
moment of a query). Then, for each job:

- **finished**: the control plane reports the job done;
- **exact**: each round's global model in MinIO equals the FedAvg of exactly the updates the
  clients got a 202 for (relative error <= 1e-6), and its ``meta.json`` lists exactly them:
  ``lost`` counts acknowledged updates missing from it, ``double`` updates counted more than
  once or counted without an acknowledgement (:func:`bench.fault_checks.check_rounds`);
- **checkpoints**: rounds 0..ROUNDS each have their global model and ``meta.json`` in MinIO;
- **queries**: a Multi-Krum query on the last round answers through the request tracker; for
  FLStore's faults, ``ANALYSTS`` analysts send FoolsGold queries over every round back to back
  from before the fault until a second after it, and every one of them must answer;
- **evidence**: the fault reached work in flight (its row's verdict: the slot the killed
  replica ran, the accepted updates the killed gateway held, the gateways' counters of
  re-runs, retried journal writes and partial forwards, the uploads refused while the store
  was full, the queries in flight);
- **recovery**: seconds from the fault (a kill; for MinIO, the end of its outage) until every
  part is alive and ready and every function has a ready replica again (``fedfaas status``).

After the platform is taken down: is any of its shared memory or any of its processes left?
Results: ``bench/results/faults.{json,md}``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from bench.fault_checks import Model, check_rounds, resnet18_model, small_model
from bench.fault_kinds import CLIENTS, FAULTS, IN_FLIGHT, ROUNDS, Fault, fill_shm
from bench.fault_platform import (
    Campaign,
    JobRun,
    NotRunnable,
    assigned,
    capped_shm,
    counters_grown,
    snapshot_counters,
)
from bench.fault_table import merge_results, passed, stored_result, summary, to_markdown
from bench.runinfo import ROOT, run_info, stop_on_sigterm, write_result

log = logging.getLogger(__name__)

UPLOADERS = 4
#: seconds a job may take to finish once its uploads are in (faults included)
JOB_TIMEOUT = 300.0
#: analysts sending the in-flight queries of FLStore's faults back to back
ANALYSTS = 2


def _create_job(c: Campaign, job: str, model: Model) -> None:
    clients = [f"c{i}" for i in range(CLIENTS)]
    body = {
        "job": job,
        "rounds": ROUNDS,
        "goal": CLIENTS,
        "clients": clients,
        "overprovision": 1.0,
        "per_leaf": 2,
        "policy": "leastconn",
        "weights_b64": base64.b64encode(save(model.zeros())).decode(),
    }
    deadline = time.monotonic() + 180
    while True:  # 503 + Retry-After (a node's store full): nothing was kept, ask again
        r = c.post_job(body, timeout=300)
        after = r.headers.get("retry-after", "")
        if r.status_code != 503 or not after.isdigit() or time.monotonic() > deadline:
            break
        log.info("job %s not created yet (%s); again in %s s", job, r.text[:200], after)
        time.sleep(int(after))
    r.raise_for_status()
    c.tokens[job] = r.json()["tokens"]


def _upload(c: Campaign, run: JobRun, rnd: int, client: str, seed: int, weight: int) -> None:
    """One client's update of round ``rnd`` through the SDK, to the node the control plane
    assigns it. A node that stays unreachable, or says the client belongs elsewhere (the
    control plane moved it off a dead node), has the client ask for its assignment again."""
    from client.sdk import FLClient, GatewayUnavailable, StaleRound

    assert run.model is not None
    token = c.tokens[run.job][client]
    deadline = time.monotonic() + 180
    while True:
        _, url = assigned(c, run.job, client)
        try:
            with FLClient(url, run.job, client, token, timeout=60, ca_file=c.p.ca_file) as fl:
                while True:  # the node's model of the previous round, as a client trains on it
                    with contextlib.suppress(Exception):
                        if int(fl.status()["version"]) >= rnd - 1:
                            break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{client}: no model {rnd - 1} on {url}")
                    time.sleep(0.1)
                body = save(run.model.update(seed))
                receipt = fl.upload(rnd, body, weight, unavailable_wait=15)
            break
        except (GatewayUnavailable, StaleRound) as exc:
            moved = isinstance(exc, GatewayUnavailable) or exc.error == "wrong_node"
            if not moved or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    run.acked.setdefault(rnd, {})[client] = (seed, weight)
    run.resent += receipt.resent


def _send_again(c: Campaign, run: JobRun, rnd: int) -> None:
    """Until round ``rnd`` is over on the control plane: each client it asks to send its
    update again (``resend``: the node that acknowledged it died with it) sends the same
    update again, once per takeover."""
    done: dict[str, int] = {}
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        view = c.cp_get(f"/v1/jobs/{run.job}")
        cur = view["round"] or {}
        if view["done"] or view["failed"] or cur.get("number") != rnd:
            return
        for client, n in (cur.get("resend") or {}).items():
            if n > done.get(client, 0):
                seed, weight = run.acked[rnd][client]
                _upload(c, run, rnd, client, seed, weight)
                done[client] = n
                run.sent_again += 1
        time.sleep(0.1)


def _wait_nodes(c: Campaign, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(n["healthy"] for n in c.cp_get("/v1/nodes")["nodes"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a node is still out of placement after {timeout:.0f} s")
        time.sleep(0.2)


def _wait_open(c: Campaign, job: str, rnd: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        cur = c.cp_get(f"/v1/jobs/{job}")["round"] or {}
        if cur.get("number") == rnd and cur.get("state") == "open":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"round {rnd} of {job} not open on the control plane: {cur}")
        time.sleep(0.1)


def wait_healthy(c: Campaign, since: float, timeout: float = 120.0) -> float | None:
    from fedfaas.platform import Platform
    from fedfaas.settings import load_settings

    plat = Platform(load_settings(state_dir=c.p.state_dir))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if plat.status(probe_ebpf=False).healthy:
                return time.monotonic() - since
        time.sleep(0.1)
    return None


def _inject(c: Campaign, fault: Fault, run: JobRun, rnd: int | None = None) -> None:
    at: dict[str, Any] = {}
    if rnd is not None:  # how far the round was when the fault went in
        at = {"round": rnd, "acked_at_fault": len(run.acked.get(rnd, {})), "clients": CLIENTS}
    try:
        run.injected = {**fault.inject(c, run), **at}
    except Exception as exc:  # the fault itself failed: the run says so
        run.error = f"injecting {fault.name}: {exc!r}"
        return
    finally:
        run.injected_done.set()
    run.fault_at = run.injected.pop("ended_at")
    run.recovery_s = wait_healthy(c, run.fault_at)


class _Refusals(logging.Handler):
    """Records the SDK's "refused for now" waits (503 with Retry-After: a node out of room)."""

    def __init__(self, run: JobRun) -> None:
        super().__init__(logging.WARNING)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        if "refused for now" in record.getMessage():
            self.run.refusals.append((time.monotonic(), record.getMessage()))


def run_job(c: Campaign, fault: Fault, job: str) -> JobRun:
    run = JobRun(job, fault.name, small_model() if fault.small_model else resnet18_model())
    sdk = logging.getLogger("client")
    refusals = _Refusals(run)
    sdk.addHandler(refusals)
    try:
        _run_job(c, fault, run)
    except Exception as exc:
        run.error = run.error or repr(exc)
    finally:
        sdk.removeHandler(refusals)
    run.checks["busy_refusals"] = len(run.refusals)
    hit, what = fault.evidence(run)
    run.checks["hit"], run.checks["evidence"] = hit, what
    return run


def _held_client(c: Campaign, fault: Fault, job: str, order: list[str]) -> str:
    """The client whose upload waits for the fault: one on the job's root node
    (``holds="root"``), on another node (``"other"``) or any (the last in ``order``)."""
    if fault.holds == "any":
        return order[-1]
    root = c.cp_get(f"/v1/jobs/{job}")["root"]
    for cl in reversed(order):
        on_root = assigned(c, job, cl)[0] == root
        if on_root == (fault.holds == "root"):
            return cl
    raise RuntimeError(f"no client of {job} on the node {fault.holds!r} asks for")


def _run_job(c: Campaign, fault: Fault, run: JobRun) -> None:
    _wait_nodes(c)  # a node the last fault took out is back in placement: the job spans both
    before = snapshot_counters(c)
    _create_job(c, run.job, run.model or small_model())
    filler: threading.Thread | None = None
    if fault.name == "shm-full":  # the store fills as the job starts: its first uploads wait
        filler = threading.Thread(target=fill_shm, args=(c, run, "creation"))
        filler.start()
    at_round = ROUNDS if fault.at_share is not None else int(c.rng.integers(1, ROUNDS + 1))
    if fault.at_share is not None:
        at_count = min(CLIENTS - 1, int(fault.at_share * CLIENTS))
    else:  # some in, and more than the uploads in flight still to come: mid round
        at_count = int(c.rng.integers(1, CLIENTS - UPLOADERS))
    injector: threading.Thread | None = None
    clients = [f"c{i}" for i in range(CLIENTS)]

    def one(cl: str, rnd: int, seed: int, w: int) -> None:
        if cl == run.held:
            run.injected_done.wait(300)
        _upload(c, run, rnd, cl, seed, w)

    for rnd in range(1, ROUNDS + 1):
        _wait_open(c, run.job, rnd)  # the assignments answer for this round from then on
        order = [clients[i] for i in c.rng.permutation(CLIENTS)]
        seeds = {cl: int(c.rng.integers(1 << 30)) for cl in clients}
        if fault.during == "upload" and rnd == at_round and fault.holds:
            run.held = _held_client(c, fault, run.job, order)  # the round cannot end first
            order = [cl for cl in order if cl != run.held] + [run.held]
        with ThreadPoolExecutor(UPLOADERS) as pool:
            futs = [pool.submit(one, cl, rnd, seeds[cl], 1 + seeds[cl] % 5) for cl in order]
            if fault.during == "upload" and rnd == at_round:
                while len(run.acked.get(rnd, {})) < at_count and not all(f.done() for f in futs):
                    time.sleep(0.002)
                injector = threading.Thread(target=_inject, args=(c, fault, run, rnd))
                injector.start()
            for f in futs:
                f.result()
        if injector is not None:
            run.injected_done.wait(300)
        _send_again(c, run, rnd)
    if filler is not None:
        filler.join()
    _finish(c, fault, run, injector)
    run.counters = counters_grown(before, snapshot_counters(c))


def _finish(c: Campaign, fault: Fault, run: JobRun, injector: threading.Thread | None) -> None:
    from client.sdk import flstore_query

    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        view = c.cp_get(f"/v1/jobs/{run.job}", timeout=JOB_TIMEOUT)
        if view["done"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run.checks["finished"] = bool(view["done"])
    run.checks["history"] = view["history"]
    analyst = c.p.analyst_token()

    def query(check: str, kind: str, **kw: Any) -> tuple[float, float]:
        """One analyst query through the SDK, which asks again while a part restarts; a
        failure (and its error) goes into ``run.checks[check]``; returns the query's span."""
        t0 = time.monotonic()
        try:
            flstore_query(
                c.p.urls["request_tracker"],
                kind,
                run.job,
                token=analyst,
                wait=120,
                ca_file=c.p.ca_file,
                **kw,
            )
            run.checks.setdefault(check, True)
        except Exception as exc:
            run.checks[check] = False
            run.checks[f"{check}_error"] = repr(exc)[:300]
        return t0, time.monotonic()

    if fault.during == "query":
        # ANALYSTS analysts query back to back from before the fault until a second after it
        kind, params = IN_FLIGHT
        spans: list[tuple[float, float]] = []
        stop = threading.Event()

        def analyst_loop() -> None:
            while not stop.is_set():
                spans.append(query("query_in_flight", kind, params=params))

        analysts = [threading.Thread(target=analyst_loop) for _ in range(ANALYSTS)]
        for a in analysts:
            a.start()
        time.sleep(float(c.rng.uniform(0.2, 1.0)))
        injector = threading.Thread(target=_inject, args=(c, fault, run))
        injector.start()
        run.injected_done.wait(60)
        time.sleep(1.0)
        stop.set()
        for a in analysts:
            a.join()
        injector.join()
        at = run.fault_at
        run.injected["queries"] = len(spans)
        run.injected["queries_at_fault"] = sum(
            1 for t0, t1 in spans if at is not None and t0 <= at <= t1
        )
    if injector is not None:
        injector.join()
    query("queries", "multi-krum", rounds=[ROUNDS], params={"f": 1})
    _check_checkpoints(c, run)


def _check_checkpoints(c: Campaign, run: JobRun) -> None:
    from core.checkpoints import CheckpointReader

    endpoint, user, password = c.p.minio()
    reader = CheckpointReader(endpoint, user, password)

    def read(rnd: int) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        try:  # MinIO's outage delays checkpoints; they must come
            return reader.get_meta(run.job, rnd), load(reader.get_global(run.job, rnd))
        except Exception:  # CheckpointNotFound, or MinIO not answering yet
            return None

    assert run.model is not None
    run.checks.update(check_rounds(run.model, run.acked, read, ROUNDS))


def survived(run: JobRun) -> bool:
    ch = run.checks
    return bool(
        not run.error
        and ch.get("finished")
        and ch.get("exact")
        and ch.get("checkpoints")
        and ch.get("queries")
        and ch.get("query_in_flight", True)
        and ch.get("lost") == 0
        and ch.get("double") == 0
    )


def leftovers(platform_id: str, shm_dir: Path = Path("/dev/shm")) -> dict[str, Any]:
    """Shared memory (in the platform's ``shm_dir``) and processes of a platform that is down."""
    from fedfaas.platform import procs
    from fedfaas.platform.context import PLATFORM_ID_VAR

    shm = [str(p) for p in shm_dir.glob(f"fedfaas-{platform_id[:12]}*")]
    left = procs.marked(PLATFORM_ID_VAR, platform_id)
    return {"shm": shm, "processes": [p.pid for p in left]}


@contextlib.contextmanager
def _environment(pairs: tuple[tuple[str, str], ...]) -> Any:
    """``pairs`` set in this process's environment (which ``fedfaas up`` reads) while inside."""
    old = {k: os.environ.get(k) for k, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_fault(
    fault: Fault, runs: int, seed: int, minio_outage_s: float, keep_logs: Path | None = None
) -> dict[str, Any]:
    from fedfaas.demo.stack import platform

    out: dict[str, Any] = {"fault": fault.name, "letter": fault.letter, "what": fault.what}
    jobs: list[JobRun] = []
    with tempfile.TemporaryDirectory(prefix="fedfaas-faults-") as tmp, contextlib.ExitStack() as es:
        state_dir = Path(tmp) / "state"
        shm = Path("/dev/shm")
        if fault.shm_cap_mib is not None:
            try:
                shm = es.enter_context(capped_shm(Path(tmp) / "shm", fault.shm_cap_mib))
            except NotRunnable as exc:
                return {**out, "not_run": str(exc), "jobs": [], "leftovers": {}}
        es.enter_context(_environment(fault.env))
        with platform(state_dir, ports=_any_ports(), shm_dir=shm) as p:  # TLS: up's default
            c = Campaign(p, np.random.default_rng(seed), minio_outage_s)
            for i in range(runs):
                run = run_job(c, fault, f"{fault.name}-{i}")
                jobs.append(run)
                functions = state_dir / "run" / "runtime" / "functions"  # gone after down
                bad = not survived(run) or not run.checks.get("hit")
                if keep_logs is not None and bad and functions.is_dir():
                    dest = keep_logs / fault.name / f"functions-{run.job}"
                    shutil.copytree(functions, dest, dirs_exist_ok=True)
                verdict = "survived" if survived(run) else "NOT survived"
                hit = "hit in flight" if run.checks.get("hit") else "NOT shown to hit"
                print(f"  {run.job}: {verdict}, {hit}: {run.checks.get('evidence')}")
            pid = p.platform_id
            out["tls"] = p.tls  # the platform users get: TLS, up's default
        out["leftovers"] = leftovers(pid, shm)
        out["model"] = jobs[0].model.name if jobs and jobs[0].model else ""
        if keep_logs is not None and not all(survived(j) and j.checks.get("hit") for j in jobs):
            shutil.copytree(state_dir / "logs", keep_logs / fault.name, dirs_exist_ok=True)
    out["jobs"] = [
        {
            "job": j.job,
            "survived": survived(j),
            "hit": bool(j.checks.get("hit")),
            "evidence": j.checks.get("evidence", ""),
            "acked": sum(len(a) for a in j.acked.values()),
            "resent": j.resent,
            "sent_again": j.sent_again,
            "injected": j.injected,
            "counters": j.counters,
            "recovery_s": j.recovery_s,
            "checks": j.checks,
            "error": j.error,
        }
        for j in jobs
    ]
    return out


def _any_ports() -> dict[str, int]:
    return dict.fromkeys(
        ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane"), 0
    )


#: faults of issues 13 and 35 this campaign does not inject, and why (none: (k) needs
#: ``mount``, and a machine without it says so in the run's ``not_run``)
NOT_RUN: dict[str, str] = {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated fault names (default: all). The rows run are merged into "
        "OUT/faults.json and faults.md: they replace those faults' rows, every other row is "
        "kept with its own run record (commit, start), and the table names each row's commit",
    )
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--minio-outage-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument(
        "--keep-logs", type=Path, default=None, help="copy the logs of a fault not survived here"
    )
    args = ap.parse_args(argv)
    names = [n for n in args.faults.split(",") if n]
    unknown = set(names) - set(FAULTS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    stored = stored_result(args.out / "faults.json")
    if isinstance(stored, str):
        ap.error(stored)
    run = run_info("bench.faults", argv)
    result: dict[str, Any] = {
        "run": run,
        "clients": CLIENTS,
        "rounds": ROUNDS,
        "runs": args.runs,
        "faults": [],
        "not_run": dict(NOT_RUN),
    }
    for i, name in enumerate(names):
        print(f"== ({FAULTS[name].letter}) {FAULTS[name].what}", flush=True)
        out = run_fault(FAULTS[name], args.runs, args.seed + i, args.minio_outage_s, args.keep_logs)
        if "not_run" in out:  # this machine cannot inject it: said so, with the reason
            print(f"  not run: {out['not_run']}")
            result["not_run"][out["letter"]] = f"{out['what']}: {out['not_run']}"
            continue
        result["faults"].append(out)
    merged = merge_results(stored, result, [f.letter for f in FAULTS.values()])
    _, md = write_result(merged, "faults", to_markdown, args.out)
    print(md)
    return 0 if all(passed(summary(f)) for f in result["faults"]) else 1


if __name__ == "__main__":
    stop_on_sigterm()
    raise SystemExit(main())
