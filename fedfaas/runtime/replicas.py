"""Replica processes: start one watchdog per replica, probe it, stop its process group."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fedfaas.runtime.function_auth import SECRETS_DIR_ENV
from fedfaas.services import spawn

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Replica:
    """One running replica of a function.

    ``state`` is ``starting`` until its first good probe, then ``ready`` or ``unready``;
    ``stopping`` once the runtime has decided to stop it (it takes no new requests then).
    """

    function: str
    slot: int
    generation: int
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_at: float = field(default_factory=time.monotonic)
    state: str = "starting"
    failures: int = 0
    ever_ready: bool = False
    node: str = ""

    @property
    def instance(self) -> str:
        """Instance name, as in ``/system/logs`` (``<function>-<slot>``)."""
        return f"{self.function}-{self.slot}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> dict[str, object]:
        """Plain facts for ``/system/replicas/{name}`` and ``fedfaas status``."""
        return {
            "instance": self.instance,
            "slot": self.slot,
            "generation": self.generation,
            "pid": self.pid,
            "port": self.port,
            "state": self.state,
            "node": self.node,
            "uptimeSeconds": round(time.monotonic() - self.started_at, 3),
            "log": str(self.log_path),
        }


def replica_env(
    function: str,
    slot: int,
    port: int,
    env_vars: Mapping[str, str],
    env_process: str,
    secrets_dir: Path,
) -> dict[str, str]:
    """A replica's environment: the runtime's (less its own settings), the deployment's
    ``envVars``, then what the watchdog and the function read about themselves (among them
    ``FEDFAAS_SECRETS_DIR``, the folder of the function's secrets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_RUNTIME_")}
    env.update(env_vars)
    pythonpath = env.get("PYTHONPATH", "")
    env.update(
        {
            "FEDFAAS_FUNCTION_NAME": function,
            "FEDFAAS_REPLICA": str(slot),
            SECRETS_DIR_ENV: str(secrets_dir),
            "HOSTNAME": f"{function}-{slot}",
            "port": str(port),
            "fprocess": env_process or "python index.py",
            "mode": "http",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": f"{_REPO_ROOT}{os.pathsep}{pythonpath}"
            if pythonpath
            else str(_REPO_ROOT),
        }
    )
    return env


def spawn_replica(
    *,
    python: str,
    function: str,
    function_dir: Path,
    slot: int,
    generation: int,
    env_vars: Mapping[str, str],
    env_process: str,
    log_dir: Path,
    secrets_dir: Path,
    node: str = "",
) -> Replica:
    """Start ``python -m fedfaas.runtime.watchdog`` for one replica, in its own process group.

    ``secrets_dir`` is the folder of the function's secrets (it must hold
    ``fedfaas-function-token``, or the replica refuses to start).

    The replica's socket is bound here and handed over (``--fd``), so that no other process can
    take its port between the choice of a free one and the replica's bind.
    """
    instance = f"{function}-{slot}"
    log_path = log_dir / f"{instance}.log"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # closed here once handed
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        fd = sock.fileno()
        argv = [
            python,
            "-m",
            "fedfaas.runtime.watchdog",
            "--function-dir",
            str(function_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--fd",
            str(fd),
            "--parent-pid",
            str(os.getpid()),
        ]
        env = replica_env(function, slot, port, env_vars, env_process, secrets_dir)
        proc = spawn(argv, log_path=log_path, env=env, cwd=function_dir, pass_fds=(fd,))
    log.info(
        "started %s gen %d (pid %d, port %d%s)",
        instance,
        generation,
        proc.pid,
        port,
        f", node {node}" if node else "",
    )
    return Replica(function, slot, generation, port, log_path, proc, node=node)


async def probe(client: httpx.AsyncClient, replica: Replica) -> bool:
    """GET ``/_/health``; True on 200."""
    try:
        r = await client.get(f"{replica.url}/_/health")
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def stop_replica(replica: Replica, grace: float) -> None:
    """SIGTERM the replica's process group, wait ``grace`` seconds, then SIGKILL; reap it."""
    replica.state = "stopping"
    proc = replica.proc
    if proc is None:
        return
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        _signal_group(proc, signal.SIGCONT)  # a stopped (hung) replica must see the SIGTERM
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            log.warning("%s did not stop in %.1fs; SIGKILL", replica.instance, grace)
            _signal_group(proc, signal.SIGKILL)
            while proc.poll() is None:
                await asyncio.sleep(0.02)
    else:
        _signal_group(proc, signal.SIGKILL)  # children it may have left behind
    log.info("stopped %s (pid %d, exit %s)", replica.instance, proc.pid, proc.returncode)


def kill_now(replica: Replica) -> None:
    """SIGKILL and reap synchronously (last-resort cleanup on shutdown)."""
    if replica.proc is not None:
        _signal_group(replica.proc, signal.SIGKILL)
        try:
            replica.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", replica.instance, replica.proc.pid)
