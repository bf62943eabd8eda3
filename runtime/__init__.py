"""The embedded OpenFaaS-compatible runtime.

``python -m runtime --stack stack.yml --state-dir DIR --auth-dir DIR`` serves the
OpenFaaS gateway API (reference/openfaas.md), with basic auth on ``/system/*`` always on, and
runs each function replica as a process (``python -m runtime.watchdog``) following the
python3-http template contract.

Exports are resolved lazily so that a replica (which imports only the watchdog) starts without
loading FastAPI and the provider.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.app import create_app
    from runtime.errors import FaasRuntimeError
    from runtime.process import RuntimeProcess
    from runtime.provider import Provider
    from runtime.settings import RuntimeSettings

_EXPORTS = {
    "create_app": "runtime.app",
    "FaasRuntimeError": "runtime.errors",
    "Provider": "runtime.provider",
    "RuntimeProcess": "runtime.process",
    "RuntimeSettings": "runtime.settings",
}

__all__ = ["FaasRuntimeError", "Provider", "RuntimeProcess", "RuntimeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
