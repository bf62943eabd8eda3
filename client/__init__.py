"""FedFaaS FL client: SDK for the node gateway, non-IID digits data, model, simulator.

Names backed by PyTorch (model, training, simulator) load lazily, so ``client.sdk`` and
``client.data`` stay importable without paying for ``import torch``.
"""

from __future__ import annotations

import importlib
from typing import Any

from client.data import ClientData, FederatedDigits, client_ids, federated_digits
from client.sdk import (
    ClientError,
    FLClient,
    GatewayUnavailable,
    GlobalModel,
    JobCreated,
    JobFailed,
    JobNotFound,
    QueryFailed,
    StaleRound,
    Unauthorized,
    UpdateRejected,
    UploadReceipt,
    create_job,
    flstore_query,
    submit_job,
)

_LAZY = {
    "DigitsCNN": "client.model",
    "make_model": "client.model",
    "state_dict_to_bytes": "client.model",
    "bytes_to_state_dict": "client.model",
    "TrainConfig": "client.train",
    "train_local": "client.train",
    "evaluate": "client.train",
    "Simulator": "client.simulator",
    "SimulatorConfig": "client.simulator",
    "RoundReport": "client.simulator",
    "round_robin": "client.simulator",
    "assignment_from_plan": "client.simulator",
    "control_plane_assignment": "client.simulator",
}

__all__ = [
    "ClientData",
    "ClientError",
    "FLClient",
    "FederatedDigits",
    "GatewayUnavailable",
    "GlobalModel",
    "JobCreated",
    "JobFailed",
    "JobNotFound",
    "QueryFailed",
    "StaleRound",
    "Unauthorized",
    "UpdateRejected",
    "UploadReceipt",
    "client_ids",
    "create_job",
    "federated_digits",
    "flstore_query",
    "submit_job",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")
