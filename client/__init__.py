"""FedFaaS FL client: the SDK (a job's handle, the node gateway's client, typed errors), the
Flower adapter, non-IID digits data, a model and a simulator.

Names backed by PyTorch (model, training, simulator) load lazily: ``client``, ``client.sdk``,
``client.flower`` and ``client.data`` need only the light distribution ``fedfaas-client``
(``pip install ./client``); the others need its ``[torch]`` extra (and ``client.data``'s
digits need scikit-learn, in that extra too).
"""

from __future__ import annotations

import importlib
from typing import Any

from client import sdk
from client.data import ClientData, FederatedDigits, client_ids, federated_digits
from client.sdk import *  # noqa: F403 - the SDK's names (client.sdk.__all__)

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
    *sdk.__all__,
    "ClientData",
    "FederatedDigits",
    "client_ids",
    "federated_digits",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")
