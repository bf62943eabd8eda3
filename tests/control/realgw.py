"""Real node gateways (``python -m gateway``) as subprocesses for the control-plane tests.

They share a Redis journal and an admin secret, run the userspace router (no eBPF needed) and
spawn their own aggregator process (``--spawn-aggregators``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from safetensors.numpy import save

from fedfaas.services import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def real_gateways(
    redis_url: str, tmp_path: Path, names: tuple[str, ...] = ("n1", "n2")
) -> Iterator[tuple[dict[str, str], str, dict[str, subprocess.Popen[bytes]]]]:
    """Yield ``(urls by node, admin secret, processes by node)``; stops what is still alive."""
    secret = secrets.token_hex(32)
    (tmp_path / "secret").write_text(secret)
    (tmp_path / "secret").chmod(0o600)
    ports = {n: free_port() for n in names}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    shm = Path("/dev/shm") / f"fedfaas-cp-{os.urandom(4).hex()}"
    try:
        for node, port in ports.items():
            peers = [f"--peer={n}=http://127.0.0.1:{p}" for n, p in ports.items() if n != node]
            log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 - handed to the child
            procs[node] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "--node",
                    node,
                    "--port",
                    str(port),
                    "--state-dir",
                    str(tmp_path / node),
                    "--redis",
                    redis_url,
                    "--shm-root",
                    str(shm),
                    "--no-ebpf",
                    *peers,
                    "--spawn-aggregators",
                    "2",
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "FEDFAAS_GATEWAY_ADMIN_SECRET_FILE": str(tmp_path / "secret")},
            )
            log.close()
        for node, port in ports.items():
            wait_for_port("127.0.0.1", port, 60, procs[node])
        yield {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}, secret, procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        _reap_orphans(shm)
        subprocess.run(["rm", "-rf", str(shm)], check=False)


def _reap_orphans(shm: Path) -> None:
    """Aggregator processes of a SIGKILLed gateway outlive it: stop those using our store."""
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(str(shm).encode() in part for part in cmd) and b"worker.py" in b" ".join(cmd):
            with suppress(ProcessLookupError):
                os.kill(int(pid_dir.name), signal.SIGKILL)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a gateway (no clean stop: its shared memory and in-flight updates are lost)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def token(secret: str, job: str, client: str) -> str:
    return hmac.new(secret.encode(), f"{job}/{client}".encode(), hashlib.sha256).hexdigest()


def upload(url, job, rnd, client, secret, tensors, weight):  # type: ignore[no-untyped-def]
    return httpx.post(
        f"{url}/v1/jobs/{job}/rounds/{rnd}/updates",
        content=save(tensors),
        headers={
            "X-Client-Id": client,
            "X-Sample-Count": str(weight),
            "Authorization": f"Bearer {token(secret, job, client)}",
        },
        timeout=30,
    )
