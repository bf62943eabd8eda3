"""``make demo``: a real federated-learning job on the FedFaaS platform, end to end.

Runs on exactly what ``fedfaas up --with all`` starts (in ``STATE/demo/platform``): MinIO,
Redis, the embedded runtime with the ``aggregator`` function, two node gateways (node0,
node1), the cache engine, the request tracker and the control plane. It creates the job on
the control plane with the SDK (``client.sdk.submit_job``; initial weights from
``client.model``, and the validation-set evaluator FLStore scores contributions with), and
trains 20 real PyTorch clients on a non-IID split of the digits data for 5 rounds, each placed
on a gateway by the control plane; one client (``client-007``) sign-flips its update. Every
round's global model is checked against FedAvg of the uploads. Then it asks the request
tracker, over HTTP, three questions FLStore answers from its cache: which client is malicious
(Multi-Krum), what each client contributed (GTG-Shapley) and which clients to pick next (Oort).
It prints the answers, accuracy and time per round, which replicas aggregated, where the
checkpoints are in MinIO, writes ``demo.png`` and ``demo.json`` to ``STATE/demo``, and stops
the platform (``fedfaas down``), also when it fails. Knobs (environment):
``FEDFAAS_DEMO_CLIENTS``, ``FEDFAAS_DEMO_ROUNDS``, ``FEDFAAS_DEMO_MALICIOUS`` (a client id,
empty for none), ``FEDFAAS_DEMO_SELECT`` (Oort's k), ``FEDFAAS_DEMO_HOLD`` (seconds to keep the
platform up after the report).
"""

from fedfaas.demo.config import DemoConfig, DemoResult
from fedfaas.demo.main import run
from fedfaas.demo.report import fedavg_error

__all__ = ["DemoConfig", "DemoResult", "fedavg_error", "run"]
