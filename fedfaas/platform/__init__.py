"""The processes of one FedFaaS node: MinIO, Redis, the embedded runtime, and later services.

``Platform(settings).up() / .down() / .status()`` is what ``fedfaas up | down | status`` runs.
The parts are data (:data:`PARTS`, :class:`ServiceSpec`); see :mod:`fedfaas.platform.parts`
for how to add one.
"""

from fedfaas.platform.context import Context
from fedfaas.platform.errors import (
    AlreadyRunning,
    PlatformError,
    PortInUse,
    ServiceFailed,
    StateDirError,
    StopFailed,
)
from fedfaas.platform.orchestrator import PartStatus, Platform, StatusReport, UpResult
from fedfaas.platform.parts import PARTS, PortSpec, ServiceSpec
from fedfaas.platform.report import render_status

__all__ = [
    "PARTS",
    "AlreadyRunning",
    "Context",
    "PartStatus",
    "Platform",
    "PlatformError",
    "PortInUse",
    "PortSpec",
    "ServiceFailed",
    "ServiceSpec",
    "StateDirError",
    "StatusReport",
    "StopFailed",
    "UpResult",
    "render_status",
]
