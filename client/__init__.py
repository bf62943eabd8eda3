"""FedFaaS FL client: the SDK (a job's handle, the node gateway's client, typed errors), the
Flower adapter, non-IID digits data, a model and a simulator.

Names backed by PyTorch (model, training, simulator) load lazily: ``client``, ``client.sdk``,
``client.flower`` and ``client.data`` need only the light distribution (``pip install
fedfaas-client``); the others need its ``[torch]`` extra (and ``client.data``'s digits need
scikit-learn, in that extra too).
"""

from __future__ import annotations

import importlib
from typing import Any

from client.data import ClientData, FederatedDigits, client_ids, federated_digits
from client.sdk import (
    Assignment,
    ClientError,
    ClientExcluded,
    ClientNotSelected,
    ClientRevoked,
    Conflict,
    FLClient,
    GatewayUnavailable,
    GlobalModel,
    InvalidQuery,
    InvalidRequest,
    Job,
    JobCreated,
    JobFailed,
    JobNotFound,
    MissingData,
    NotFound,
    PrivacyBudgetSpent,
    QueryFailed,
    RoundClient,
    RoundNotWritten,
    StaleRound,
    Unauthorized,
    UpdateRejected,
    UploadReceipt,
    attach_job,
    create_job,
    enroll,
    flstore_query,
    leave,
    report_failure,
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
    "Assignment",
    "ClientData",
    "ClientError",
    "ClientExcluded",
    "ClientNotSelected",
    "ClientRevoked",
    "Conflict",
    "FLClient",
    "FederatedDigits",
    "GatewayUnavailable",
    "GlobalModel",
    "InvalidQuery",
    "InvalidRequest",
    "Job",
    "JobCreated",
    "JobFailed",
    "JobNotFound",
    "MissingData",
    "NotFound",
    "PrivacyBudgetSpent",
    "QueryFailed",
    "RoundClient",
    "RoundNotWritten",
    "StaleRound",
    "Unauthorized",
    "UpdateRejected",
    "UploadReceipt",
    "attach_job",
    "client_ids",
    "create_job",
    "enroll",
    "federated_digits",
    "flstore_query",
    "leave",
    "report_failure",
    "submit_job",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")
