"""aggregator: LIFL's eager hierarchical FedAvg as a warm serverless function (python3-http).

On import (the warm runtime) a replica starts ``FEDFAAS_AGGREGATOR_ENDPOINTS`` endpoints
(default 2) that register, job-agnostic, with its node's router at
``FEDFAAS_GATEWAY_ROUTER_SOCKET`` (``settings.py``). The node gateway grants an idle endpoint
a job when a slot of that job's round needs one; work then arrives as 64-byte frames on the
router socket, never as HTTP calls (``worker.py``). After the task the endpoint stays warm and
may be granted another job: no replica is started per job.

HTTP (health and status only):

- ``GET``: this replica's pid, node and its endpoints (id, job granted, jobs served, tasks done).
- anything else: 405 with a JSON reason.
"""

import logging
import os
import threading

from .settings import AggregatorSettings
from .worker import EndpointWorker, start_workers

log = logging.getLogger("fedfaas.aggregator")

_workers: list[EndpointWorker] = []
_lock = threading.Lock()
_settings = AggregatorSettings()


def _boot():
    if _settings.router_socket is None:
        log.warning(
            "aggregator: FEDFAAS_GATEWAY_ROUTER_SOCKET is not set; this replica serves no job"
        )
        return
    if _settings.kernel == "torch":
        import torch

        torch.set_num_threads(_settings.threads)

    def run():
        workers = start_workers(str(_settings.router_socket), _settings.endpoints)
        with _lock:
            _workers.extend(workers)

    threading.Thread(target=run, name="aggregator-boot", daemon=True).start()


def handle(event, context):
    if event.method != "GET":
        return {
            "statusCode": 405,
            "body": {
                "error": "method_not_allowed",
                "detail": "the aggregator takes its work from its node's router; GET for status",
            },
            "headers": {"Allow": "GET"},
        }
    with _lock:
        st = [w.status() for w in _workers]
    return {
        "statusCode": 200,
        "body": {
            "pid": os.getpid(),
            "node": _settings.node,
            "router_socket": str(_settings.router_socket or ""),
            "endpoints": st,
        },
    }


_boot()
