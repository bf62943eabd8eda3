"""Optional local aggregator processes (``spawn_aggregators``): one per job, N endpoints each.

Normally the control plane scales the aggregator function through the provider API; this
launcher lets one gateway run on its own (tests, benchmarks, a laptop).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

WORKER = Path(__file__).resolve().parent.parent / "functions" / "aggregator" / "worker.py"


class Launcher:
    def __init__(self, settings: GatewaySettings) -> None:
        self.n = settings.spawn_aggregators
        self.procs: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.args: dict[int, tuple[str, str]] = {}

    def ensure(self, job_id: int, store_dir: str, socket_path: str) -> None:
        if self.n <= 0:
            return
        self.args[job_id] = (store_dir, socket_path)
        self._spawn(job_id)

    def _spawn(self, job_id: int) -> None:
        store_dir, socket_path = self.args[job_id]
        p = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--socket",
                socket_path,
                "--job-id",
                str(job_id),
                "--store",
                store_dir,
                "--endpoints",
                str(self.n),
                "--log-level",
                "WARNING",
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        )
        self.procs.setdefault(job_id, []).append(p)
        log.info("job %d: aggregator process %d with %d endpoints", job_id, p.pid, self.n)

    def replace(self, job_id: int) -> None:
        """Start a replacement when a spawned process died."""
        procs = self.procs.get(job_id, [])
        dead = [p for p in procs if p.poll() is not None]
        for p in dead:
            procs.remove(p)
            self._spawn(job_id)

    def stop_all(self) -> None:
        for procs in self.procs.values():
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                        p.wait(5)
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait(5)
        self.procs.clear()
