"""The soak (issue 13): the whole platform under sustained load, a fault in the middle.

    make soak                                    # 10 minutes, a non-root gateway killed at 5
    python -m bench.soak --duration 120 --fault replica

A fresh ``fedfaas up --with all`` (:func:`fedfaas.demo.stack.platform`), on ``up``'s default, TLS:
locust's users (``loadtests/platform.py``) verify the parts against the platform's CA
(``SOAK_CA_FILE``), as the SDK's clients do; one job with a round
per ``TRAINERS`` updates and as many rounds as the time allows (``--max-rounds`` bounds the
count), and locust (``loadtests/platform.py``, headless, one process, loopback only) for
``--duration`` seconds: ``TRAINERS`` FL clients uploading every round through the control
plane's assignment, ``ANALYSTS`` analysts querying FLStore, one operator reading the control
plane's nodes and plans. Halfway through, one fault of :mod:`bench.faults` is injected.

Measured, over the same window for every route: requests, throughput, p50/p99 latency and
failures per route (locust's own statistics); every failure with its time, so each is counted
either inside the fault window (from the fault until the platform is healthy again, plus
``--fault-grace`` seconds) or outside it; the memory (PSS, from ``/proc/<pid>/smaps_rollup``)
of each component every ``--sample-s`` seconds, its start being the first sample after
``--warmup`` seconds and its end the last.

Checked from the clients' side (:func:`check_models`): each trainer uploads its own update of
each round (:mod:`loadtests.updates`) and records every acknowledgement (a 202, or 409
``duplicate_client`` after an attempt whose answer was lost). Every published round's model
(MinIO's checkpoint) must equal the FedAvg of exactly the updates acknowledged in that round;
an acknowledged update that no published model holds is **lost**, one a model holds without
an acknowledgement is counted **unacknowledged**; the round still open when the load stops
holds **pending** ones. No server counter goes into these numbers.
Results: ``bench/results/soak.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import load, save

from bench.fault_checks import ReadRound, check_rounds
from bench.fault_kinds import FAULTS
from bench.fault_platform import Campaign, JobRun
from bench.faults import wait_healthy
from bench.runinfo import ROOT, run_header, run_info, stop_on_sigterm, write_result
from bench.soak_stats import classify, read_exceptions, read_history, read_stats
from loadtests.updates import MODEL, read_ack_file, seed_of, update_of, weight_of

TRAINERS = 16
ANALYSTS = 4
OPERATORS = 1
JOB = "soak"
#: the faults of :mod:`bench.fault_kinds` a soak can inject: a kill or an outage, not a query's,
#: none that times itself by holding a client back
KILLS = [
    n
    for n, f in FAULTS.items()
    if f.during == "upload" and f.shm_cap_mib is None and f.holds in ("", "root")
]
#: components whose memory is sampled: a part of ``fedfaas up`` or a function's replicas
FUNCTIONS = {"aggregator replicas": "aggregator", "cache functions": "flstore-cache-"}


def pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (shared pages split among their users); 0 if
    the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def component_pids(c: Campaign) -> dict[str, list[int]]:
    """Component -> its live pids: each part ``fedfaas up`` recorded (a restarted part under
    its new pid) and the replicas of the aggregator and of the cache functions."""
    from fedfaas.platform import credentials, state

    st = state.load(c.p.state_dir)
    out: dict[str, list[int]] = {s.name: [s.pid] for s in (st.services if st else [])}
    try:
        listed = httpx.get(
            f"{c.p.urls['runtime']}/system/functions",
            auth=credentials.basic_auth(c.p.secrets),
            timeout=10,
            verify=c.verify,
        ).json()
        names = [str(f["name"]) for f in listed]
        for label, prefix in FUNCTIONS.items():
            pids: list[int] = []
            for name in (n for n in names if n.startswith(prefix)):
                reps = httpx.get(
                    f"{c.p.urls['runtime']}/system/replicas/{name}",
                    auth=credentials.basic_auth(c.p.secrets),
                    timeout=10,
                    verify=c.verify,
                ).json()
                pids += [int(r["pid"]) for r in reps if r.get("pid")]
            out[label] = pids
    except (httpx.HTTPError, ValueError, KeyError):
        pass  # the runtime restarting: this sample has the parts only
    return out


class Sampler(threading.Thread):
    """Every ``every`` seconds: the PSS of each component (see :func:`component_pids`)."""

    def __init__(self, c: Campaign, every: float, t0: float) -> None:
        super().__init__(daemon=True)
        self.c, self.every, self.t0 = c, every, t0
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = component_pids(self.c)
            mem = {name: sum(pss(p) for p in ps) for name, ps in pids.items()}
            self.samples.append(
                {
                    "t": round(time.time() - self.t0, 1),
                    "pss": mem,
                    "replicas": {label: len(pids.get(label, [])) for label in FUNCTIONS},
                    "cache": cache_state(self.c),
                    "redis": redis_state(self.c),
                }
            )
            self.stop.wait(self.every)


def cache_state(c: Campaign) -> dict[str, int]:
    """What the cache functions hold, as the engine counts it: objects and bytes."""
    from fedfaas.platform import credentials

    token = credentials.read(c.p.secrets, credentials.SERVICE_TOKEN)
    try:
        st = httpx.get(
            f"{c.p.urls['cache_engine']}/v1/state",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            verify=c.verify,  # the engine requires a platform certificate over TLS
        ).json()
    except (httpx.HTTPError, ValueError):
        return {}
    fns = st.get("functions") or {}
    return {
        "objects": int(st.get("objects") or 0),
        "functions": len(fns),
        "used_bytes": sum(int(f.get("used_bytes") or 0) for f in fns.values()),
    }


#: Redis key families, by prefix: who writes them and what bounds them
REDIS_FAMILIES = (
    ("fedfaas:control:", "control plane: job state with its round history"),
    ("fedfaas:", "gateways' journal (two rounds per job)"),
    ("flstore:query:", "request tracker: query records (kept --result-ttl, 1 h)"),
    ("flstore:catalog:", "cache engine: catalogue (each round's clients)"),
    ("flstore:", "cache engine: locations and functions"),
)


def redis_state(c: Campaign) -> dict[str, int]:
    """Redis's ``used_memory`` and the bytes of each key family (``MEMORY USAGE``, sampled
    over every key), read as its admin user."""
    from core.secretfiles import redis_client

    url = c.p.urls["redis"].replace("http://", "redis://") + "/0"
    r = redis_client(url, c.p.secrets / "redis-admin.json", decode_responses=True)
    try:
        out = {"used_memory": int(r.info("memory")["used_memory"]), "keys": 0}
        for key in r.scan_iter(count=1000):
            family = next((p for p, _ in REDIS_FAMILIES if key.startswith(p)), "other")
            out[family] = out.get(family, 0) + int(r.memory_usage(key) or 0)
            out["keys"] += 1
        return out
    except Exception:  # Redis restarting under a fault: no sample this time
        return {}
    finally:
        r.close()


def create_job(c: Campaign, rounds: int, deadline_s: float) -> dict[str, str]:
    w0 = MODEL.zeros()
    body = {
        "job": JOB,
        "rounds": rounds,
        "goal": TRAINERS,
        "clients": [f"c{i}" for i in range(TRAINERS)],
        "overprovision": 1.0,
        "deadline_s": deadline_s,
        "policy": "leastconn",
        "weights_b64": base64.b64encode(save(w0)).decode(),
    }
    r = c.post_job(body)
    r.raise_for_status()
    tokens: dict[str, str] = r.json()["tokens"]
    return tokens


def _secret_file(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def run_locust(
    c: Campaign, work: Path, tokens: dict[str, str], duration: float
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start locust headless on ``loadtests/platform.py``: its process and CSV prefix."""
    env = {
        **os.environ,
        "SOAK_JOB": JOB,
        "SOAK_TOKENS": str(_secret_file(work / "tokens.json", json.dumps(tokens))),
        "SOAK_SECRETS": str(c.p.secrets),
        "SOAK_TRACKER": c.p.urls["request_tracker"],
        # the platform's CA, which the users verify the parts against (plain: none)
        **({"SOAK_CA_FILE": c.p.ca_file} if c.p.ca_file else {}),
        "SOAK_EVENTS": str(work / "failures.jsonl"),
        "SOAK_ACKS": str(work / "acks.jsonl"),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    users = TRAINERS + ANALYSTS + OPERATORS
    argv = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "loadtests" / "platform.py"),
        "--headless",
        "--only-summary",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{int(duration)}s",
        "--stop-timeout",
        "10",
        "--host",
        c.p.urls["control_plane"],
        "--csv",
        str(work / "soak"),
        "--csv-full-history",
        "--exit-code-on-error",
        "0",
    ]
    log = open(work / "locust.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, work / "soak"


def check_models(
    acks: dict[int, dict[str, str]], read: ReadRound, completed: int, patience: float = 60.0
) -> dict[str, Any]:
    """The clients' check of rounds ``1..completed`` (see the module and
    :func:`bench.fault_checks.check_rounds`): ``lost``, ``double`` (counted twice or without
    an acknowledgement), ``exact``, the rounds whose model is ``wrong`` or ``missing``, and
    ``pending`` (acknowledged in a round after ``completed``)."""
    acked = {
        r: {c: (seed_of(c, r), weight_of(c)) for c in a} for r, a in acks.items() if r <= completed
    }
    out = check_rounds(MODEL, acked, read, completed, patience)
    out["missing"] = [r for r in out["missing"] if r > 0]  # round 0 holds no client's update
    out["exact"] = out["exact"] and not out["missing"]
    out["rounds_checked"] = completed - len(out["missing"])
    out["acked"] = sum(len(a) for a in acked.values())
    out["acked_via_duplicate"] = sum(
        1 for r, a in acks.items() if r <= completed for h in a.values() if h == "duplicate"
    )
    out["pending"] = sum(len(a) for r, a in acks.items() if r > completed)
    return out


def minio_rounds(c: Campaign, job: str) -> ReadRound:
    """:data:`~bench.fault_checks.ReadRound` of ``job`` from the platform's MinIO."""
    from core.checkpoints import CheckpointReader

    endpoint, user, password = c.p.minio()
    reader = CheckpointReader(endpoint, user, password)

    def read(rnd: int) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        try:
            return reader.get_meta(job, rnd), load(reader.get_global(job, rnd))
        except Exception:  # CheckpointNotFound: not (yet) written
            return None

    return read


def memory_summary(samples: list[dict[str, Any]], warmup: float) -> dict[str, Any]:
    """Per component: PSS at the first sample after ``warmup`` and at the last; their ratio."""
    after = [s for s in samples if s["t"] >= warmup]
    if not after:
        return {}
    first, last = after[0], samples[-1]
    names = sorted(set(first["pss"]) | set(last["pss"]))
    comp = {}
    for n in names:
        a, b = first["pss"].get(n, 0), last["pss"].get(n, 0)
        comp[n] = {"start": a, "end": b, "ratio": (b / a) if a else None}
    a, b = sum(first["pss"].values()), sum(last["pss"].values())
    return {
        "start_t": first["t"],
        "end_t": last["t"],
        "components": comp,
        "total": {"start": a, "end": b, "ratio": b / a if a else None},
        "replicas": {"start": first.get("replicas"), "end": last.get("replicas")},
        "cache": {"start": first.get("cache"), "end": last.get("cache")},
        "redis": {"start": first.get("redis"), "end": last.get("redis")},
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    from fedfaas.demo.stack import platform

    fault = FAULTS[args.fault] if args.fault != "none" else None
    with tempfile.TemporaryDirectory(prefix="fedfaas-soak-") as tmp:
        work = Path(tmp)
        ports = dict.fromkeys(
            ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane"), 0
        )
        with platform(work / "state", ports=ports) as p:  # TLS: up's default
            c = Campaign(p, np.random.default_rng(args.seed))
            tokens = create_job(c, args.max_rounds, args.deadline_s)
            t0 = time.time()
            sampler = Sampler(c, args.sample_s, t0)
            sampler.start()
            locust, prefix = run_locust(c, work, tokens, args.duration)
            injected: dict[str, Any] = {}
            window = (float("inf"), float("inf"))
            if fault is not None:
                time.sleep(max(0.0, t0 + args.duration / 2 - time.time()))
                at_wall, at_mono = time.time(), time.monotonic()
                injected = fault.inject(c, JobRun(JOB, fault.name))
                ended = injected.pop("ended_at", at_mono)
                recovery = wait_healthy(c, ended)
                injected["recovery_s"] = recovery
                injected["at_s"] = round(at_wall - t0, 1)
                window = (at_wall, at_wall + (ended - at_mono) + (recovery or 0) + args.fault_grace)
            locust.wait(args.duration + 120)
            if not Path(f"{prefix}_stats.csv").exists():  # the load never ran: say why
                tail = (work / "locust.log").read_text()[-2000:]
                raise RuntimeError(f"locust wrote no statistics (exit {locust.returncode}): {tail}")
            functions = work / "state" / "run" / "runtime" / "functions"  # gone after down
            if args.keep_logs is not None and functions.is_dir():
                shutil.copytree(functions, args.keep_logs / "functions", dirs_exist_ok=True)
            sampler.stop.set()
            sampler.join(30)
            view = c.cp_get(f"/v1/jobs/{JOB}")
            checked = check_models(
                read_ack_file(work / "acks.jsonl"), minio_rounds(c, JOB), int(view["completed"])
            )
            failures = []
            fpath = work / "failures.jsonl"
            if fpath.exists():
                failures = [json.loads(line) for line in fpath.read_text().splitlines() if line]
            window = (window[0] - t0, window[1] - t0)
            for f in failures:  # seconds into the run, as every other time of the result
                f["t"] = round(f["t"] - t0, 2)
            result = {
                "duration_s": args.duration,
                "tls": p.tls,  # the platform users get: TLS, up's default
                "users": {"trainers": TRAINERS, "analysts": ANALYSTS, "operators": OPERATORS},
                "update_bytes": len(save(update_of("c0", 1))),
                "fault": None
                if fault is None
                else {"name": fault.name, "letter": fault.letter, "what": fault.what, **injected},
                "fault_window_s": None if fault is None else [round(w, 1) for w in window],
                "rounds_completed": view["completed"],
                "clients_check": {k: v for k, v in checked.items() if k != "rounds"},
                "round_checks": checked["rounds"],
                "job_failed": view.get("failed"),
                "routes": read_stats(prefix),
                "history": read_history(prefix, t0),
                "failures": classify(failures, window),
                "task_exceptions": read_exceptions(prefix),
                "memory_samples": sampler.samples,
                "memory": memory_summary(sampler.samples, args.warmup),
                "locust_exit": locust.returncode,
            }
        if args.keep_logs is not None:
            shutil.copytree(work / "state" / "logs", args.keep_logs, dirs_exist_ok=True)

            shutil.copy(work / "locust.log", args.keep_logs / "locust.log")
    return result


def _ms_cell(v: float | None) -> str:
    """A latency cell: whole ms, or n/a where locust had none."""
    return "n/a" if v is None else f"{v:.0f}"


def _mib(b: int) -> str:
    return f"{b / 2**20:.1f}"


def to_markdown(r: dict[str, Any]) -> str:
    f = r["fault"]
    lines = [
        "# Soak (`make soak`)",
        "",
        run_header(r["run"]),
        "",
        f"{r['duration_s']:.0f} s of locust (`loadtests/platform.py`) against a fresh `fedfaas up "
        f"--with all{'' if r.get('tls') else ' --no-tls'}` on loopback "
        f"({'TLS, its default' if r.get('tls') else 'plain HTTP'}): {r['users']['trainers']} "
        f"FL clients uploading "
        f"{r['update_bytes'] / 1024:.0f} KiB updates every round, {r['users']['analysts']} "
        f"analysts querying FLStore, {r['users']['operators']} operator reading the control "
        f"plane. Rounds completed: {r['rounds_completed']} (job failed: "
        f"{r['job_failed'] or 'no'}).",
        "",
    ]
    ch = r["clients_check"]
    wrong = ", ".join(str(x) for x in ch["wrong"][:10]) or "none"
    missing = ", ".join(str(x) for x in ch["missing"][:10]) or "none"
    lines += [
        "The clients' check (their own acknowledgements against MinIO's checkpoints; no server "
        "counter):",
        "",
        "| check | value |",
        "|---|---:|",
        f"| rounds whose published model was checked against the FedAvg of exactly the "
        f"updates acknowledged in it | {ch['rounds_checked']} of {r['rounds_completed']} |",
        f"| ... the model is that FedAvg (max relative error {ch['max_rel_err']:.1e}) "
        f"| {'yes' if ch['exact'] else 'NO'} |",
        f"| rounds whose model is not (first 10) | {wrong} |",
        f"| rounds without a checkpoint (first 10) | {missing} |",
        f"| updates acknowledged in those rounds | {ch['acked']} |",
        f"| ... acknowledged by 409 duplicate_client after a lost answer "
        f"| {ch['acked_via_duplicate']} |",
        f"| **lost** (acknowledged, in no published model) | **{ch['lost']}** |",
        f"| counted twice or without an acknowledgement | {ch['double']} |",
        f"| pending (acknowledged in the round open when the load stopped) | {ch['pending']} |",
        "",
    ]
    if f:
        lines += [
            f"Fault at {f['at_s']:.0f} s: ({f['letter']}) {f['what']}; platform healthy again "
            f"after {f['recovery_s'] if f['recovery_s'] is None else round(f['recovery_s'], 2)} "
            f"s. Fault window (failures expected): {r['fault_window_s'][0]:.0f}-"
            f"{r['fault_window_s'][1]:.0f} s.",
            "",
        ]
    fl = r["failures"]
    exc = r["task_exceptions"]
    lines += [
        f"**Errors outside the fault window: {fl['errors']}**; exceptions in the load's own "
        f"tasks: {sum(e['count'] for e in exc)}; failures inside it: "
        f"{fl['expected']} ({', '.join(f'{k}: {v}' for k, v in fl['in_fault_window'].items()) or 'none'}).",
        "",
        "| route | requests | req/s | p50 (ms) | p99 (ms) | failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["routes"]:
        lines.append(
            f"| {row['route']} | {row['requests']} | {row['rps']:.1f} | {_ms_cell(row['p50_ms'])} "
            f"| {_ms_cell(row['p99_ms'])} | {row['failures']} |"
        )
    m = r["memory"]
    if m:
        lines += [
            "",
            f"Memory (PSS, MiB) at {m['start_t']:.0f} s (after the warm-up) and at the end "
            f"({m['end_t']:.0f} s):",
            "",
            "| component | start | end | end / start |",
            "|---|---:|---:|---:|",
        ]
        for name, v in {**m["components"], "total": m["total"]}.items():
            ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}"
            lines.append(f"| {name} | {_mib(v['start'])} | {_mib(v['end'])} | {ratio} |")
        reps, cache = m.get("replicas") or {}, m.get("cache") or {}
        if reps.get("start") is not None:
            lines += [
                "",
                f"Replicas at the start / end: {reps['start']} / {reps['end']}. What the cache "
                f"functions hold (the engine's count) at the start / end: {cache.get('start')} "
                f"/ {cache.get('end')}.",
            ]
        red = m.get("redis") or {}
        ra, rb = red.get("start") or {}, red.get("end") or {}
        if ra and rb:
            lines += [
                "",
                f"Redis (`used_memory` {_mib(ra['used_memory'])} -> {_mib(rb['used_memory'])} "
                f"MiB; {ra['keys']} -> {rb['keys']} keys), by key family (`MEMORY USAGE`, KiB):",
                "",
                "| keys | written by | start | end |",
                "|---|---|---:|---:|",
            ]
            for prefix, who in (*REDIS_FAMILIES, ("other", "-")):
                if prefix in ra or prefix in rb:
                    lines.append(
                        f"| `{prefix}` | {who} | {ra.get(prefix, 0) / 1024:.0f} "
                        f"| {rb.get(prefix, 0) / 1024:.0f} |"
                    )
    if exc:
        lines += ["", "Exceptions in the load's tasks:", ""]
        lines += [f"- {e['count']} x {e['message']}" for e in exc]
    if fl["outside_examples"]:
        lines += ["", "Errors outside the fault window (first 10):", ""]
        lines += [f"- {e['t']:.1f} s: {e['name']}: {e['error']}" for e in fl["outside_examples"]]
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    h = r["history"]
    a1.plot([x["t"] for x in h], [x["rps"] for x in h], label="requests/s")
    a1.plot([x["t"] for x in h], [x["fails_per_s"] for x in h], label="failures/s")
    a1.set_ylabel("per second")
    a1.legend()
    names = sorted({n for s in r["memory_samples"] for n in s["pss"]})
    for n in names:
        a2.plot(
            [s["t"] for s in r["memory_samples"]],
            [s["pss"].get(n, 0) / 2**20 for s in r["memory_samples"]],
            label=n,
        )
    a2.set_ylabel("PSS (MiB)")
    a2.set_xlabel("seconds")
    a2.legend(fontsize=7, ncol=3)
    if r["fault_window_s"]:
        for ax in (a1, a2):
            ax.axvspan(*r["fault_window_s"], color="red", alpha=0.15)
    fig.suptitle("Soak: the whole platform under load, a fault in the middle (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--fault", default="gateway", choices=[*KILLS, "none"])
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--fault-grace", type=float, default=5.0)
    ap.add_argument("--max-rounds", type=int, default=100000)
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--keep-logs", type=Path, default=None, help="copy the platform's logs here")
    args = ap.parse_args(argv)
    run = run_info("bench.soak", argv)
    result = {"run": run, **soak(args)}
    stored, md = write_result(result, "soak", to_markdown, args.out)
    plot(stored, args.out / "soak.png")
    print(md)
    ch = stored["clients_check"]
    ok = (
        stored["failures"]["errors"] == 0
        and not stored["task_exceptions"]
        and not stored["job_failed"]
        and ch["exact"]
        and ch["lost"] == 0
        and ch["double"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
