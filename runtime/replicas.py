"""Replica processes: start one watchdog per replica, probe it, stop its process group.

A replica runs the embedded watchdog (``python -m runtime.watchdog``), or, with the
runtime's ``--watchdog PATH``, OpenFaaS's real of-watchdog in HTTP mode in front of the Docker
template's server (``template/python3-http/index.py``), as a function container on Kubernetes.
``python -m runtime.replicas INDEX RUNTIME_PID`` is that template server's ``fprocess``
(see :func:`serve_template`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from core.services import free_port, spawn
from core.tls import CA_FILE_ENV, CERT_FILE_ENV, KEY_FILE_ENV, TlsFiles
from runtime.function_auth import SECRETS_DIR_ENV

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[1]
#: The Docker template's server, which of-watchdog fronts (``--watchdog``).
TEMPLATE_INDEX = _REPO_ROOT / "template" / "python3-http" / "index.py"


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
    #: the template server's port behind of-watchdog (``--watchdog``); None: embedded watchdog
    upstream_port: int | None = None
    #: ``https`` where the replica serves TLS (the runtime's function TLS)
    scheme: str = "http"

    @property
    def instance(self) -> str:
        """Instance name, as in ``/system/logs`` (``<function>-<slot>``)."""
        return f"{self.function}-{self.slot}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

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
    tls: TlsFiles | None = None,
) -> dict[str, str]:
    """A replica's environment: the runtime's (less its own settings), the deployment's
    ``envVars``, then what the watchdog and the function read about themselves (among them
    ``FEDFAAS_SECRETS_DIR``, the folder of the function's secrets, and with ``tls`` the
    files the watchdog serves HTTPS with, :func:`core.tls.replica_files`)."""
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
            # where this replica answers on the machine, for a caller that addresses one
            # function's replica directly (the FLStore request tracker; OpenFaaS's
            # direct_functions reaches a function's Service the same way)
            "FEDFAAS_REPLICA_URL": f"{'https' if tls else 'http'}://127.0.0.1:{port}",
            "fprocess": env_process or "python index.py",
            "mode": "http",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": f"{_REPO_ROOT}{os.pathsep}{pythonpath}"
            if pythonpath
            else str(_REPO_ROOT),
        }
    )
    for name in (CERT_FILE_ENV, KEY_FILE_ENV):
        env.pop(name, None)  # a deployment's envVars do not choose the replica's certificate
    if tls is not None:
        assert tls.ca is not None  # TlsFiles.check: client certificates required, a CA set
        env.update(
            {CERT_FILE_ENV: str(tls.cert), KEY_FILE_ENV: str(tls.key), CA_FILE_ENV: str(tls.ca)}
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
    watchdog: Path | None = None,
    tls: TlsFiles | None = None,
) -> Replica:
    """Start one replica in its own process group: ``python -m runtime.watchdog``, or
    the of-watchdog binary ``watchdog`` (see :func:`_of_watchdog_env`); with ``tls`` (the
    embedded watchdog only) it serves HTTPS with those files.

    ``secrets_dir`` is the folder of the function's secrets (it must hold
    ``fedfaas-function-token``, or the replica refuses to start).

    The embedded watchdog's socket is bound here and handed over (``--fd``), so that no other
    process can take its port between the choice of a free one and the replica's bind.
    """
    if tls is not None and watchdog is not None:
        raise ValueError("of-watchdog serves plain HTTP: replicas with TLS need the embedded one")
    instance = f"{function}-{slot}"
    log_path = log_dir / f"{instance}.log"
    upstream_port = None
    if watchdog is not None:
        port = upstream_port = free_port()
        while upstream_port == port:
            upstream_port = free_port()
        env = replica_env(function, slot, port, env_vars, env_process, secrets_dir)
        workdir = _of_watchdog_env(env, python, function_dir, log_dir / instance, upstream_port)
        proc = spawn([str(watchdog)], log_path=log_path, env=env, cwd=workdir)
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # closed once handed
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            fd = sock.fileno()
            argv = [
                python,
                "-m",
                "runtime.watchdog",
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
            env = replica_env(function, slot, port, env_vars, env_process, secrets_dir, tls)
            proc = spawn(argv, log_path=log_path, env=env, cwd=function_dir, pass_fds=(fd,))
    log.info(
        "started %s gen %d (pid %d, port %d%s)",
        instance,
        generation,
        proc.pid,
        port,
        f", node {node}" if node else "",
    )
    return Replica(
        function,
        slot,
        generation,
        port,
        log_path,
        proc,
        node=node,
        upstream_port=upstream_port,
        scheme="https" if tls is not None else "http",
    )


def _of_watchdog_env(
    env: dict[str, str], python: str, function_dir: Path, workdir: Path, upstream_port: int
) -> Path:
    """Make ``env`` of-watchdog's (HTTP mode) and lay out its working folder; returns it.

    The folder holds ``function`` (a link to the handler folder, where index.py imports
    ``function.handler`` from, as ``/home/app/function`` in the image) and ``tmp/`` (``TMPDIR``:
    of-watchdog's health lock file ``.lock``, one per replica, since each removes its own on
    SIGTERM). ``fprocess`` is :func:`serve_template` on ``upstream_port`` (``upstream_url``).
    of-watchdog itself listens on ``port`` and serves its metrics on 8081 (fixed upstream): one
    of-watchdog replica per machine at a time.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    link = workdir / "function"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(function_dir.resolve(), target_is_directory=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    env.update(
        {
            "mode": "http",
            "upstream_url": f"http://127.0.0.1:{upstream_port}",
            # of-watchdog splits fprocess on spaces: a python path with a space would break
            "fprocess": f"{python} -m runtime.replicas {TEMPLATE_INDEX} {os.getpid()}",
            "TMPDIR": str(workdir / "tmp"),
        }
    )
    return workdir


def serve_template(index: Path, runtime_pid: int) -> None:
    """Run the template's ``index.py`` as ``__main__`` (of-watchdog's ``fprocess``), its waitress
    server on ``$upstream_url``'s host and port instead of the fixed ``0.0.0.0:5000`` of the
    image, so that replicas do not share a port; ``function`` is imported from the working
    folder (``sys.path[0]`` under ``python -m``).

    of-watchdog does not watch the runtime, so this server does: once of-watchdog's parent is no
    longer ``runtime_pid`` (the runtime died, even by SIGKILL), it SIGTERMs its process group,
    of-watchdog and itself, so that no replica outlives the runtime.
    """
    import importlib
    import runpy
    import threading
    from typing import Any
    from urllib.parse import urlsplit

    waitress = importlib.import_module("waitress")  # the template's (untyped) dependency
    upstream = urlsplit(os.environ["upstream_url"])  # noqa: SIM112 (of-watchdog's name)
    serve = waitress.serve

    def serve_upstream(app: Any, **kwargs: Any) -> None:
        kwargs.update(host=upstream.hostname, port=upstream.port)
        serve(app, **kwargs)

    setattr(waitress, "serve", serve_upstream)  # noqa: B010 (an untyped module)
    threading.Thread(target=_watch_runtime, args=(runtime_pid,), daemon=True).start()
    runpy.run_path(str(index), run_name="__main__")


def _watch_runtime(runtime_pid: int) -> None:
    watchdog_stat = Path(f"/proc/{os.getppid()}/stat")
    while True:
        time.sleep(0.5)
        try:  # "pid (comm) state ppid ...", comm may hold spaces and parentheses
            ppid = int(watchdog_stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            ppid = 0
        if ppid != runtime_pid:
            print(f"runtime {runtime_pid} is gone; stopping this replica", file=sys.stderr)
            os.killpg(0, signal.SIGTERM)
            time.sleep(5.0)
            os.killpg(0, signal.SIGKILL)


async def probe(client: httpx.AsyncClient, replica: Replica) -> bool:
    """GET ``/_/health``; True on 200. Behind of-watchdog also the template server must accept
    a connection: of-watchdog answers 200 as soon as it has forked it, and until it listens
    every call would get of-watchdog's 500."""
    try:
        r = await client.get(f"{replica.url}/_/health")
    except httpx.HTTPError:
        return False
    if r.status_code != 200:
        return False
    if replica.upstream_port is None:
        return True
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", replica.upstream_port),
            client.timeout.connect or 1.0,
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


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


if __name__ == "__main__":
    serve_template(Path(sys.argv[1]), int(sys.argv[2]))
