"""bench-flstore section: GTG-Shapley as the demo asks it, through an evaluator function.

The demo (``make demo``, :mod:`fedfaas.demo.flstore`) asks the request tracker for the
GTG-Shapley values of the last round's 20 clients (``max_permutations`` 200) of a job whose
evaluator is the ``digits-evaluator`` function (softmax regression on digits, 650 floats). Here
the same query runs on the same serving stack (runtime, engine, tracker, cache functions, the
evaluator function deployed on the runtime) against a digits job of 20 clients a round, with
the job's evaluator spec in two forms, each on a job of its own (so that no utility evaluated
for one is reused for the other):

- ``batched``: the spec as the demo writes it (:mod:`cache_engine.evaluators` defaults: up to
  64 models per request, 4 requests at once, the function scaled to ``min(4, cores)`` replicas);
- ``one model per request``: ``"batch": 1``, one HTTP request per sub-model, as before batches.

Both ask GTG's prefixes position by position across a cycle's permutations (the values of one
permutation at a time: ``tests/flstore/test_workloads_contribution.py``). Each query is asked
twice: the second asking finds every utility in the cache function's memo. The answers must be
equal across the two forms.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx

from bench.flstore_rounds_report import section_run
from bench.harness.flstore_stack import FLStoreStack
from bench.harness.synthetic import write_digits_history
from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import meta
from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS, function_deployment
from core.services import MinioServer, RedisServer

log = logging.getLogger("bench.flstore")
_REPO = Path(__file__).resolve().parent.parent
EVALUATOR = "digits-evaluator"
CLIENTS, ROUNDS = 20, 3
#: the demo's query (fedfaas/demo/flstore.py)
PARAMS = {"method": "gtg", "max_permutations": 200}
FORMS: dict[str, dict[str, Any]] = {
    "batched": {"kind": "function", "function": EVALUATOR},
    "one model per request": {"kind": "function", "function": EVALUATOR, "batch": 1},
}


def _write_job(cold: MinioColdStore, job: str, spec: dict[str, Any]) -> None:
    """A digits job of :data:`CLIENTS` clients a round whose round 0 names ``spec``."""
    write_digits_history(cold, job, ROUNDS, per_round=CLIENTS, pool=CLIENTS)
    doc = json.loads(cold.get_bytes(meta(job, 0)))
    doc["round_meta"]["evaluator"] = spec
    cold.put_bytes(meta(job, 0), json.dumps(doc).encode())


def _deploy_evaluator(stack: FLStoreStack) -> None:
    assert stack.runtime is not None
    body = function_deployment(
        EVALUATOR,
        "ghcr.io/fedfaas/digits-evaluator:0.1.0",
        env={"DIGITS_SPLIT_SEED": "0", "exec_timeout": "2m"},
        handler_dir=_REPO / "functions" / "evaluator",
        secrets=[FUNCTION_TOKEN_SECRET],
    )
    body["labels"]["com.openfaas.scale.max"] = "4"
    with OpenFaaS(stack.runtime_url, stack.runtime.auth) as gw:
        res = gw.deploy(body)
        if not res.ok:
            raise RuntimeError(f"{EVALUATOR} not deployed: {res.status} {res.message}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = gw.function(EVALUATOR)
            if st is not None and st.available_replicas >= 1:
                return
            time.sleep(0.2)
    raise RuntimeError(f"{EVALUATOR} did not become ready in 120 s")


def _replicas(stack: FLStoreStack) -> int:
    assert stack.runtime is not None
    with OpenFaaS(stack.runtime_url, stack.runtime.auth) as gw:
        st = gw.function(EVALUATOR)
        return st.available_replicas if st is not None else 0


def shapley(work: Path) -> dict[str, Any]:
    """Both forms on one stack (see the module): seconds of the first and second asking, the
    evaluator's replicas, and whether the answers agree."""
    ms = MinioServer(data_dir=work / "shapley-minio").start()
    rs = RedisServer(data_dir=work / "shapley-redis").start()
    stack: FLStoreStack | None = None
    try:
        cold = MinioColdStore(ms.endpoint, ms.access_key, ms.secret_key)
        jobs = {form: f"demo-gtg-{i}" for i, form in enumerate(FORMS)}
        for form, job in jobs.items():
            _write_job(cold, job, FORMS[form])
        stack = FLStoreStack(
            work / "shapley-stack", rs, ms, tracker_settings={"query_timeout": 600}
        ).start()
        _deploy_evaluator(stack)
        out: dict[str, Any] = {"clients": CLIENTS, "params": PARAMS, "forms": {}}
        client = httpx.Client(timeout=900)
        for form, job in jobs.items():
            stack.ingest(job, range(0, ROUNDS + 1))
            stack.wait_idle(600)
            body = {"workload": "shapley", "job": job, "rounds": [ROUNDS], "params": PARAMS}
            # warm the cache function's evaluator (its first model builds it), not timed
            client.post(
                f"{stack.tracker_url}/v1/queries?wait=true",
                headers=stack.auth,
                json={"workload": "evaluate", "job": job, "rounds": [ROUNDS]},
            ).raise_for_status()
            askings = []
            for _ in range(2):
                t0 = time.perf_counter()
                r = client.post(
                    f"{stack.tracker_url}/v1/queries?wait=true", headers=stack.auth, json=body
                )
                r.raise_for_status()
                askings.append((time.perf_counter() - t0, r.json()["result"]))
            res = askings[0][1]
            out["forms"][form] = {
                "spec": FORMS[form],
                "first_s": askings[0][0],
                "second_s": askings[1][0],
                "permutations": res["permutations"],
                "evaluations": res["evaluations"],
                "truncated_marginals": res["truncated_marginals"],
                "values": res["values"],
                "same_on_second_asking": askings[1][1]["values"] == res["values"],
                "evaluator_replicas": _replicas(stack),
            }
            log.info("shapley (%s): %.2f s, again %.2f s", form, askings[0][0], askings[1][0])
        a, b = (f["values"] for f in out["forms"].values())
        out["same_values"] = a.keys() == b.keys() and all(abs(a[c] - b[c]) <= 1e-12 for c in a)
        first = [f["first_s"] for f in out["forms"].values()]
        out["speedup"] = first[1] / first[0] if first[0] > 0 else None
        return out
    finally:
        if stack is not None:
            stack.stop()
        rs.stop()
        ms.stop()


def markdown(sh: dict[str, Any]) -> list[str]:
    """The section's table."""
    lines = [
        "## GTG-Shapley as the demo asks it",
        "",
        *section_run(sh),
        f"{sh['clients']} clients (digits, softmax regression: 650 floats), params "
        f"`{json.dumps(sh['params'])}`, through the `{EVALUATOR}` function on the embedded "
        "runtime; each form on a job of its own, asked twice (the second asking finds every "
        "utility in the cache function's memo).",
        "",
        "| evaluator spec | first asking s | second asking s | permutations | evaluations "
        "| evaluator replicas |",
        "|---|---|---|---|---|---|",
    ]
    for form, f in sh["forms"].items():
        lines.append(
            f"| {form} | {f['first_s']:.2f} | {f['second_s']:.3f} | {f['permutations']} "
            f"| {f['evaluations']} | {f['evaluator_replicas']} |"
        )
    lines += [
        "",
        f"Same values in both forms: {sh['same_values']}. One model per request / batched: "
        f"{sh['speedup']:.1f}x.",
        "",
    ]
    return lines
