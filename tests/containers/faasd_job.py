"""An FL job on the containerised platform, docs/jobs.md's way ("A job from the SDK"), and the same
FLStore questions computed here from the containerised MinIO's checkpoints.

Run inside faasd's namespace (tests/containers/faasd_harness.py: ``Faasd.run``), where the
compose services' names resolve::

    python tests/containers/faasd_job.py --secrets DIR [--job NAME --clients N --rounds R]
        [--control-plane URL --tracker URL --ca-file CA]

The control plane and the request tracker are faasd's plain ``http://control-plane:8070`` and
``http://request-tracker:8092`` unless given (the chart's, over https: tests/k8s/test_job_on_node.py);
``--ca-file`` is the platform's CA for https URLs (the SDK's ``ca_file``), the gateways' too.

The job: ``submit_job`` on the control plane (digits softmax model, ``digits-evaluator`` as its
evaluator), every client enrolls, asks ``control_plane_assignment`` for its node gateway,
trains on its digits shard and uploads with ``FLClient``. Each round's global model is compared
with float64 FedAvg of what was uploaded. Then Shapley (GTG, scored by the ``digits-evaluator``
function), Multi-Krum and Oort are asked through the request tracker, and each is computed again
here with the same workload code on the round's objects read back from MinIO (Shapley scored
in process on the digits the evaluator holds out). Prints one JSON document (the last line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: faasd's plain URLs (the defaults of --control-plane and --tracker)
CONTROL_PLANE = "http://control-plane:8070"
TRACKER = "http://request-tracker:8092"
MINIO = "minio:9000"


def queries(clients: list[str], rounds: int) -> dict[str, dict[str, Any]]:
    """The three questions, asked of the last round (Oort: of the round after it)."""
    last = rounds
    return {
        "shapley": {"round": last, "method": "gtg", "seed": 2, "round_trunc_threshold": 0.0},
        "multi-krum": {"round": last, "f": 1},
        "oort": {"round": last + 1, "k": 3, "candidates": clients, "seed": 7},
    }


def run_job(
    secrets: Path,
    job: str,
    n_clients: int,
    rounds: int,
    control_plane: str = CONTROL_PLANE,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """docs/jobs.md's job; returns per-round FedAvg errors and where each client uploaded."""
    from safetensors.numpy import load

    from client.data import federated_digits
    from client.model import load_bytes_into, make_model, model_to_bytes
    from client.sdk import FLClient, enroll, submit_job
    from client.simulator import control_plane_assignment
    from client.train import TrainConfig, train_local
    from core import fedavg

    secret = (secrets / "gateway-admin-secret").read_text().strip()
    data = federated_digits(n_clients, seed=1)
    created = submit_job(
        control_plane,
        job,
        model_to_bytes(make_model(0, "softmax")),
        rounds=rounds,
        goal=n_clients,
        admin_token=secret,
        evaluator={"kind": "function", "function": "digits-evaluator"},
        ca_file=ca_file,
    )
    clients = [c.client_id for c in data.clients]
    tokens = enroll(control_plane, job, clients, created["enrollment_token"], ca_file=ca_file)
    gateway_of = control_plane_assignment(control_plane, job, secret, ca_file=ca_file)
    report: list[dict[str, Any]] = []
    for rnd in range(1, rounds + 1):
        gateway_of.wait_round(rnd)
        uploads: list[dict[str, np.ndarray]] = []
        weights: list[int] = []
        placed: dict[str, str] = {}
        names: dict[str, str | None] = {}  # the name each gateway's certificate is checked by
        for c in data.clients:
            a = gateway_of.answer(c.client_id)
            url = placed[c.client_id] = str(a["gateway_url"])
            names[c.client_id] = a.get("tls_name")
            with FLClient(
                url,
                job,
                c.client_id,
                tokens[c.client_id],
                ca_file=ca_file,
                tls_name=a.get("tls_name"),
            ) as fl:
                t0 = time.perf_counter()
                model = load_bytes_into(make_model(0, "softmax"), fl.wait_for_version(rnd - 1).data)
                res = train_local(model, c.x, c.y, TrainConfig())
                meta = {"loss": res.mean_loss, "duration_s": time.perf_counter() - t0}
                state = model.state_dict()
                fl.upload(rnd, state, res.num_samples, meta=meta)
                uploads.append({k: v.detach().numpy().copy() for k, v in state.items()})
                weights.append(res.num_samples)
        first = data.clients[0].client_id
        with FLClient(
            placed[first], job, first, tokens[first], ca_file=ca_file, tls_name=names[first]
        ) as fl:
            published = fl.wait_for_version(rnd, timeout=180)
        got = load(published.data)
        errors = {
            k: fedavg.rel_error(got[k], fedavg.fedavg_reference([u[k] for u in uploads], weights))
            for k in got
        }
        report.append(
            {
                "round": rnd,
                "version": published.version,
                "rel_error": max(errors.values()),
                "gateways": sorted(set(placed.values())),
                "global_sha": _sha(published.data),
            }
        )
    return {"rounds": report, "clients": [c.client_id for c in data.clients]}


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def ask_tracker(
    secrets: Path,
    job: str,
    asked: dict[str, dict[str, Any]],
    tracker: str = TRACKER,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """Each question through the request tracker (as an analyst)."""
    from client.sdk import flstore_query

    analyst = (secrets / "analyst-token").read_text().strip()
    out = {}
    for workload, params in asked.items():
        answer = flstore_query(
            tracker, workload, job, params=params, token=analyst, wait=300, ca_file=ca_file
        )
        out[workload] = {"result": answer["result"], "function": answer.get("function")}
    return out


def computed_here(
    secrets: Path, job: str, rounds: int, asked: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The same questions with the same workload code on the objects read from MinIO, and the
    checkpointed global models' digests."""
    from cache_engine.catalog import MemoryCatalog
    from cache_engine.cold_store import MinioColdStore
    from cache_engine.queries import parse_query, plan, run_workload
    from client.data import load_digits_arrays, stratified_test_split
    from client.model import make_model
    from core.checkpoints.keys import global_key
    from core.secretfiles import read_credentials
    from flstore_workloads import TorchEvaluator

    creds = read_credentials(secrets / "minio-gateway.json", "MinIO")
    cold = MinioColdStore(MINIO, creds.username, creds.password, "fedfaas", create=False)
    cat = MemoryCatalog()
    cat.add_round(job, 0, [])
    for rnd in range(1, rounds + 1):
        meta = cold.round_meta(job, rnd)
        cat.add_round(job, rnd, sorted(meta["clients"]))
    # digits-evaluator's validation data (functions/evaluator/handler.py, DIGITS_SPLIT_SEED=0)
    x, y = load_digits_arrays()
    _, held_out = stratified_test_split(y, 0.2, np.random.default_rng(0))
    module = make_model(0, "softmax")
    here = TorchEvaluator(module, x[held_out], y[held_out], names=sorted(module.state_dict()))
    out: dict[str, Any] = {}
    for workload, params in asked.items():
        q = parse_query({"workload": workload, "job": job, "params": params})
        pl = plan(q, cat)
        out[workload] = run_workload(workload, pl.params, {k: cold.get(k) for k in pl.keys}, here)
    from minio import Minio

    mc = Minio(MINIO, access_key=creds.username, secret_key=creds.password, secure=False)
    out["global_sha"] = {
        rnd: _sha(mc.get_object("fedfaas", global_key(job, rnd)).read())
        for rnd in range(1, rounds + 1)
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--secrets", type=Path, required=True, help="deploy/faasd/prepare.py's platform folder"
    )
    p.add_argument("--job", default="faasd-digits")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--control-plane", default=CONTROL_PLANE, help="the control plane's URL")
    p.add_argument("--tracker", default=TRACKER, help="the request tracker's URL")
    p.add_argument("--ca-file", default=None, help="the platform's CA, for https URLs")
    ns = p.parse_args(argv)
    job = run_job(ns.secrets, ns.job, ns.clients, ns.rounds, ns.control_plane, ns.ca_file)
    asked = queries(job["clients"], ns.rounds)
    tracker = ask_tracker(ns.secrets, ns.job, asked, ns.tracker, ns.ca_file)
    here = computed_here(ns.secrets, ns.job, ns.rounds, asked)
    print(json.dumps({"job": job, "asked": asked, "tracker": tracker, "here": here}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
