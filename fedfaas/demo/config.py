"""What the demo runs (``DemoConfig``) and what it found (``DemoResult``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

CHANCE = 0.10


@dataclass
class DemoConfig:
    """What the demo runs; every default is what ``make demo`` shows."""

    clients: int = 20
    nodes: int = 2
    rounds: int = 5
    alpha: float = 0.5
    seed: int = 0
    workers: int = 2
    job: str = "digits"
    aggregators: str = "runtime"  # or "process"
    endpoints_per_node: int = 2
    hold: float = 0.0
    min_accuracy: float = 0.5  # exit code 1 below this final test accuracy

    @classmethod
    def from_env(cls) -> DemoConfig:
        env = os.environ
        return cls(
            clients=int(env.get("FEDFAAS_DEMO_CLIENTS", 20)),
            rounds=int(env.get("FEDFAAS_DEMO_ROUNDS", 5)),
            nodes=int(env.get("FEDFAAS_DEMO_NODES", 2)),
            aggregators=env.get("FEDFAAS_DEMO_AGGREGATORS", "runtime"),
            hold=float(env.get("FEDFAAS_DEMO_HOLD", 0)),
        )


@dataclass
class DemoResult:
    rounds: list[dict[str, Any]] = field(default_factory=list)
    aggregators: str = ""
    checkpoints_by: str = ""
    checkpoint_keys: list[str] = field(default_factory=list)
    bucket: str = "fedfaas"
    minio_url: str = ""
    console_url: str = ""
    minio_data: str = ""
    nodes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
