"""``make demo``: a real federated-learning job on FedFaaS, end to end, on this machine.

Starts Redis and MinIO (``fedfaas.services``), two node gateways (``python -m gateway``), the
aggregator function on the embedded runtime (``python -m fedfaas.runtime``, one function per
node; plain aggregator processes if the runtime cannot run it), creates a job whose initial
weights come from ``client.model``, and trains 20 real PyTorch clients on a non-IID split of
the digits data for 5 rounds with eager hierarchical aggregation across both nodes. It then
prints accuracy and time per round, where the checkpoints are in MinIO and how to browse
them, writes ``demo.png`` and ``demo.json`` to the state folder, and stops everything it
started. Knobs (environment): ``FEDFAAS_DEMO_CLIENTS``, ``FEDFAAS_DEMO_ROUNDS``,
``FEDFAAS_DEMO_NODES``, ``FEDFAAS_DEMO_AGGREGATORS`` (runtime|process), ``FEDFAAS_DEMO_HOLD``
(seconds to keep MinIO and its console up at the end).
"""

from fedfaas.demo.config import DemoConfig, DemoResult
from fedfaas.demo.main import run
from fedfaas.demo.procs import wait_http
from fedfaas.demo.report import fedavg_error

__all__ = ["DemoConfig", "DemoResult", "fedavg_error", "run", "wait_http"]
