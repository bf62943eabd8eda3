"""Settings of one ``aggregator`` replica (read once, from its environment)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.node import NODE_ENV, ROUTER_SOCKET_ENV


class AggregatorSettings(BaseSettings):
    """One replica of the ``aggregator`` function.

    Attributes
    ----------
    router_socket : the node gateway's router socket (``FEDFAAS_GATEWAY_ROUTER_SOCKET``); no
        endpoints start without it.
    node : the node this replica runs on (``FEDFAAS_NODE``: the embedded runtime's placement,
        the pod's ``spec.nodeName`` on Kubernetes); shown in the status.
    endpoints : endpoints this replica registers (each serves one slot at a time).
    kernel : ``numpy`` (blocked axpy) or ``torch`` (fused ``add_``) accumulation.
    threads : torch threads when ``kernel`` is torch.
    top_threads : coordinate ranges a top aggregator folds at once (numpy kernel; default: the
        replica's cores, at most 4). The top runs alone at the round's tail, after every leaf;
        leaves and middles fold on one thread each, side by side.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_AGGREGATOR_", extra="ignore")

    router_socket: Path | None = Field(default=None, validation_alias=ROUTER_SOCKET_ENV)
    node: str = Field(default="", validation_alias=NODE_ENV)
    endpoints: int = Field(default=2, ge=1, le=64)
    kernel: Literal["numpy", "torch"] = "numpy"
    threads: int = Field(default=1, ge=1)
    top_threads: int = Field(default_factory=lambda: min(4, os.cpu_count() or 1), ge=1)

    @field_validator("kernel")
    @classmethod
    def _torch_installed(cls, value: str) -> str:
        # the aggregator's image installs numpy, not torch (functions/aggregator/requirements.txt)
        if value == "torch" and importlib.util.find_spec("torch") is None:
            raise ValueError(
                "FEDFAAS_AGGREGATOR_KERNEL=torch, but this image has no torch (the aggregator's "
                "image installs numpy only): use the numpy kernel, or add torch to "
                "functions/aggregator/requirements.txt and rebuild the image"
            )
        return value
