"""What the demo runs (``DemoConfig``) and what it found (``DemoResult``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

CHANCE = 0.10


@dataclass
class DemoConfig:
    """What the demo runs; every default is what ``make demo`` shows.

    ``malicious`` is the client that sign-flips its update every round (``None``: every client
    is honest); ``select`` is how many clients Oort picks for the next round; ``platform``
    overrides :class:`fedfaas.settings.PlatformSettings` fields (tests put every port on 0).
    """

    clients: int = 20
    rounds: int = 5
    alpha: float = 0.5
    seed: int = 0
    workers: int = 2
    job: str = "digits"
    model: str = "softmax"  # client.model's; the digits-evaluator function scores both
    malicious: str | None = "client-007"
    select: int = 10
    hold: float = 0.0
    min_accuracy: float = 0.5  # exit code 1 below this final test accuracy
    platform: dict[str, Any] = field(default_factory=dict)
    #: "async": the job runs FedBuff (buffers of ``clients // 4`` updates, at least 4, so
    #: that FLStore's Multi-Krum can judge one) and a third of the clients are 5x slower
    mode: str = "sync"

    @property
    def buffer(self) -> int:
        """Updates per version in async mode: ``clients // 4``, at least 4 (Multi-Krum with
        f = 1 needs 4 updates), at most ``clients``."""
        return min(self.clients, max(4, self.clients // 4))

    @property
    def versions(self) -> int:
        """Model versions the job publishes: its rounds, or (async) as many buffers as the
        sync rounds' updates fill."""
        return self.rounds if self.mode == "sync" else self.rounds * self.clients // self.buffer

    def slow_clients(self, ids: list[str]) -> dict[str, float]:
        """Async mode: every third client is 5x slower."""
        return {c: 5.0 for c in ids[2::3]} if self.mode == "async" else {}

    @classmethod
    def from_env(cls, mode: str = "sync") -> DemoConfig:
        """The defaults, the environment's knobs, and the mode (async: no malicious client,
        it would be in few buffers)."""
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, not {mode!r}")
        env = os.environ
        malicious = env.get("FEDFAAS_DEMO_MALICIOUS", "client-007") or None
        return cls(
            clients=int(env.get("FEDFAAS_DEMO_CLIENTS", 20)),
            rounds=int(env.get("FEDFAAS_DEMO_ROUNDS", 5)),
            malicious=malicious if mode == "sync" else None,
            select=int(env.get("FEDFAAS_DEMO_SELECT", 10)),
            hold=float(env.get("FEDFAAS_DEMO_HOLD", 0)),
            mode=mode,
        )


@dataclass
class DemoResult:
    """Everything the report and ``demo.json`` show."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    platform_id: str = ""  # FEDFAAS_PLATFORM_ID of every process the platform started
    urls: dict[str, str] = field(default_factory=dict)  # platform part -> URL
    placement: dict[str, int] = field(default_factory=dict)  # gateway URL -> clients, round 1
    aggregation: dict[str, Any] = field(default_factory=dict)  # replicas and their tasks
    checkpoint_keys: list[str] = field(default_factory=list)
    bucket: str = "fedfaas"
    minio_user: str = ""
    answers: dict[str, Any] = field(default_factory=dict)  # malicious, shapley, oort
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    seconds: float = 0.0
    error: str = ""
    problems: list[str] = field(default_factory=list)  # why the exit code is 1, if it is
