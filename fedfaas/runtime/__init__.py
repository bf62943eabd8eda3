"""The embedded OpenFaaS-compatible runtime.

``python -m fedfaas.runtime --stack stack.yml --state-dir DIR --auth-dir DIR`` serves the
OpenFaaS gateway API (reference/openfaas.md), with basic auth on ``/system/*`` always on, and
runs each function replica as a process (``python -m fedfaas.runtime.watchdog``) following the
python3-http template contract.

Exports are resolved lazily so that a replica (which imports only the watchdog) starts without
loading FastAPI and the provider.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfaas.runtime.app import create_app
    from fedfaas.runtime.errors import FaasRuntimeError
    from fedfaas.runtime.process import RuntimeProcess
    from fedfaas.runtime.provider import Provider
    from fedfaas.runtime.settings import RuntimeSettings

_EXPORTS = {
    "create_app": "fedfaas.runtime.app",
    "FaasRuntimeError": "fedfaas.runtime.errors",
    "Provider": "fedfaas.runtime.provider",
    "RuntimeProcess": "fedfaas.runtime.process",
    "RuntimeSettings": "fedfaas.runtime.settings",
}

__all__ = ["FaasRuntimeError", "Provider", "RuntimeProcess", "RuntimeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fedfaas.runtime' has no attribute {name!r}")
