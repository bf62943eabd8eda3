"""bench-flstore's big rounds on ``fedfaas up --with all`` (issue 36).

:class:`UpWithAll` starts the one-machine platform as a user does (``python -m fedfaas.cli up
--with all --no-tls``: MinIO, Redis, the runtime, both node gateways, the cache engine, the
request tracker and the control plane), each part on a free port, and stops it with ``fedfaas down``
(which also removes its data). The bench's settings reach the cache engine and the request
tracker through their environment variables (``FEDFAAS_ENGINE_*``, ``FEDFAAS_TRACKER_*``), as a
user would set them. Plain HTTP, not ``up``'s default TLS: the section compares FLStore with the
ObjStore-Agg and Cache-Agg baselines, whose servers speak plain HTTP, so no side pays for TLS. It offers what the big-round section uses of
:class:`bench.harness.flstore_stack.FLStoreStack` (the engine's and the tracker's addresses, the
admin and function credentials, ``ingest``, ``wait_idle``), and the platform's MinIO.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.flstore_stack import FLStoreStack
from core.services import MinioServer, RedisServer
from fedfaas.platform import state

log = logging.getLogger("bench.flstore")
_REPO = Path(__file__).resolve().parent.parent
#: every part on a free port of its own (the machine is shared)
_OPTIONAL_PORTS = ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane")
_CORE_PORTS = ("runtime_port", "minio_port", "minio_console_port", "redis_port")


def settings_env(prefix: str, settings: dict[str, Any]) -> dict[str, str]:
    """``settings`` as a component's environment variables (``{"max_functions": 16}`` with
    prefix ``FEDFAAS_ENGINE_`` -> ``FEDFAAS_ENGINE_MAX_FUNCTIONS=16``; mappings as JSON)."""
    return {
        prefix + k.upper(): json.dumps(v) if isinstance(v, (dict, list)) else str(v)
        for k, v in settings.items()
    }


def _run_cli(state_dir: Path, args: list[str], env: dict[str, str], timeout: float) -> str:
    cmd = [sys.executable, "-m", "fedfaas.cli", *args, "--state-dir", str(state_dir)]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=_REPO, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"fedfaas {args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


class UpWithAll(FLStoreStack):
    """``fedfaas up --with all`` in ``state_dir`` (see the module).

    Parameters
    ----------
    state_dir
        The platform's state folder (its secrets, data and logs).
    engine_settings, tracker_settings
        :class:`~cache_engine.settings.EngineSettings` and
        :class:`~request_tracker.settings.TrackerSettings`, given as environment variables.
    """

    def __init__(
        self,
        state_dir: Path,
        engine_settings: dict[str, Any] | None = None,
        tracker_settings: dict[str, Any] | None = None,
    ) -> None:
        unknown: Any = None  # the platform's Redis and MinIO: known once it is up
        super().__init__(
            state_dir, unknown, unknown, dict(engine_settings or {}), dict(tracker_settings or {})
        )
        self._runtime_url = ""

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "OPENFAAS_URL"}
        env["FEDFAAS_PORTS"] = json.dumps(dict.fromkeys(_OPTIONAL_PORTS, 0))
        env.update({f"FEDFAAS_{k.upper()}": "0" for k in _CORE_PORTS})
        env.update(settings_env("FEDFAAS_ENGINE_", self.engine_settings))
        env.update(settings_env("FEDFAAS_TRACKER_", self.tracker_settings))
        return env

    def start(self, timeout: float = 600.0) -> UpWithAll:
        """``fedfaas up --with all --no-tls``; stopped again (``down``) if it fails."""
        try:
            _run_cli(self.workdir, ["up", "--with", "all", "--no-tls"], self._env(), timeout)
            st = state.load(self.workdir)
            if st is None:
                raise RuntimeError(f"fedfaas up wrote no state in {self.workdir}")
            ports: dict[str, int] = {}
            for rec in st.services:
                ports.update(rec.ports)
            self.engine_port = ports["cache_engine"]
            self.tracker_port = ports["request_tracker"]
            self._runtime_url = f"http://{self.host}:{ports['runtime']}"
            secrets = self.workdir / "secrets"
            self.minio = MinioServer(
                data_dir=self.workdir / "data" / "minio",
                host=self.host,
                port=ports["minio"],
                console_port=ports["minio_console"],
                secrets_dir=secrets,
            )
            self.redis = RedisServer(
                data_dir=self.workdir / "data" / "redis",
                host=self.host,
                port=ports["redis"],
                secrets_dir=secrets,
            )
        except Exception:
            self.stop()
            raise
        log.info("fedfaas up --with all in %s: engine %s", self.workdir, self.engine_url)
        return self

    @property
    def runtime_url(self) -> str:
        return self._runtime_url

    def logs(self) -> str:
        """The last 3,000 characters of every log of the platform."""
        paths = sorted((self.workdir / "logs").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in paths)

    def engine_log(self) -> str:
        path = self.workdir / "logs" / "cache-engine.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """``fedfaas down`` (every part stopped, the platform's data removed)."""
        if state.load(self.workdir) is None:
            return
        try:
            _run_cli(self.workdir, ["down"], self._env(), 600)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log.warning("fedfaas down in %s: %s", self.workdir, exc)
