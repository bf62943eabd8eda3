"""aggregator: LIFL's eager hierarchical FedAvg as a warm serverless function (python3-http).

On import (the warm runtime) it starts ``FEDFAAS_AGGREGATOR_ENDPOINTS`` endpoints (default 2)
that register with the node gateway's router at ``FEDFAAS_GATEWAY_SOCKET`` for job
``FEDFAAS_AGGREGATOR_JOB_ID`` and read objects from ``FEDFAAS_AGGREGATOR_STORE`` (the job's
namespace folder). Work arrives as frames, not HTTP calls (``worker.py``).

HTTP:
- ``GET``: status of this replica's endpoints.
- ``POST {"action": "attach", "socket", "job_id", "store", "endpoints"}``: start endpoints
  for another job in this warm replica (what the control plane calls when it reuses one).
- ``POST {"action": "aggregate", "store", "keys": [...], "weights": [...]}``: one-shot FedAvg of
  sealed objects, answered with the weight sum, count, norm and the first values (debugging).
"""

import json
import logging
import os
import threading

import numpy as np

from fedfaas import fedavg, wire
from fedfaas.objstore import StoreClient, StoreError

from .worker import EndpointWorker, start_workers

log = logging.getLogger("fedfaas.aggregator")

_workers: list[EndpointWorker] = []
_lock = threading.Lock()


def _attach(socket_path, job_id, store, n):
    workers = start_workers(socket_path, int(job_id), store, int(n))
    with _lock:
        _workers.extend(workers)
    return [w.status() for w in workers]


def _boot():
    sock = os.environ.get("FEDFAAS_GATEWAY_SOCKET")
    job = os.environ.get("FEDFAAS_AGGREGATOR_JOB_ID")
    store = os.environ.get("FEDFAAS_AGGREGATOR_STORE")
    if sock and job and store:
        if os.environ.get("FEDFAAS_AGGREGATOR_KERNEL") == "torch":
            import torch

            torch.set_num_threads(int(os.environ.get("FEDFAAS_AGGREGATOR_THREADS", "1")))
        threading.Thread(
            target=_attach,
            args=(sock, job, store, os.environ.get("FEDFAAS_AGGREGATOR_ENDPOINTS", "2")),
            name="aggregator-boot",
            daemon=True,
        ).start()


def _aggregate(req):
    client = StoreClient(req["store"])
    keys, weights = req["keys"], req.get("weights")
    objs = [client.open(k) for k in keys]
    try:
        if weights is None:
            weights = [wire.read_header(o.buf).weight for o in objs]
        n = (objs[0].nbytes - wire.HEADER_SIZE) // 4
        out = np.empty(n, np.float32)
        acc = fedavg.Accumulator(out)
        for o, w in zip(objs, weights, strict=True):
            acc.add(o.ndarray(np.float32, wire.HEADER_SIZE, n), float(w))
        acc.finalize()
        return {
            "count": acc.count,
            "weight": acc.weight,
            "l2": float(np.linalg.norm(out)),
            "head": [float(x) for x in out[:8]],
        }
    finally:
        for o in objs:
            o.close()


def handle(event, context):
    if event.method == "GET":
        with _lock:
            st = [w.status() for w in _workers]
        return {"statusCode": 200, "body": {"endpoints": st, "pid": os.getpid()}}
    try:
        req = json.loads(event.body or b"{}")
        action = req.get("action")
        if action == "attach":
            body = {
                "endpoints": _attach(
                    req["socket"], req["job_id"], req["store"], req.get("endpoints", 1)
                )
            }
        elif action == "aggregate":
            body = _aggregate(req)
        else:
            return {
                "statusCode": 400,
                "body": {"error": "bad_action", "detail": "action must be 'attach' or 'aggregate'"},
            }
    except (KeyError, TypeError, ValueError) as exc:
        return {"statusCode": 400, "body": {"error": "bad_request", "detail": repr(exc)}}
    except (OSError, StoreError) as exc:
        return {"statusCode": 404, "body": {"error": "not_found", "detail": str(exc)}}
    return {"statusCode": 200, "body": body}


_boot()
