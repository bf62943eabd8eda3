"""What the fault campaign's faults act on: the running platform (:class:`Campaign`), one
job's record (:class:`JobRun`), the gateways' fault counters around it, and the capped memory
file system fault (k) fills."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.fault_checks import Model, counter_delta, gateway_counters
from fedfaas.demo.stack import Running


@dataclass
class Campaign:
    """What the faults act on: the running platform and the campaign's random generator."""

    p: Running
    rng: np.random.Generator
    minio_outage_s: float = 30.0
    #: job -> client -> token (the control plane's answer to the job's creation)
    tokens: dict[str, dict[str, str]] = field(default_factory=dict)
    _client_tls: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.p.admin_secret()}"}

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify`` for the harness's own calls to the parts: on ``fedfaas up``'s
        default TLS, the platform's CA, presenting ``fedfaas``'s certificate (the cache engine
        requires one), as the control plane presents its own (True without TLS)."""
        return self.p.verify

    def client_tls(self) -> ssl.SSLContext | None:
        """TLS as a client of the platform has it: the platform's CA, no certificate of its
        own (None without TLS; made once)."""
        from core.tls import client_context

        if self._client_tls is None and self.p.ca_file:
            self._client_tls = client_context(Path(self.p.ca_file))
        return self._client_tls

    def pid_of(self, part: str) -> int:
        from fedfaas.platform import state

        st = state.load(self.p.state_dir)
        rec = None if st is None else st.record(part)
        if rec is None:
            raise RuntimeError(f"no part {part!r} recorded")
        return rec.pid

    def kill_part(self, part: str) -> dict[str, Any]:
        pid = self.pid_of(part)
        os.kill(pid, signal.SIGKILL)
        return {"part": part, "pid": pid, "ended_at": time.monotonic()}

    def replicas(self, function: str) -> list[dict[str, Any]]:
        from fedfaas.platform import credentials

        r = httpx.get(
            f"{self.p.urls['runtime']}/system/replicas/{function}",
            auth=credentials.basic_auth(self.p.secrets),
            timeout=10,
            verify=self.verify,
        )
        r.raise_for_status()
        return [x for x in r.json() if x.get("state") == "ready"]

    def kill_replica(self, function: str) -> dict[str, Any]:
        ready = self.replicas(function)
        victim = ready[int(self.rng.integers(len(ready)))]
        os.kill(int(victim["pid"]), signal.SIGKILL)
        return {"function": function, "pid": int(victim["pid"]), "ended_at": time.monotonic()}

    def nodes(self) -> dict[str, str]:
        """Node name -> its gateway's URL (the control plane's view)."""
        return {n["name"]: n["url"] for n in self.cp_get("/v1/nodes")["nodes"]}

    def part_of(self, node: str) -> str:
        return "gateway" if node == "node0" else "gateway-node1"

    def root_part(self, job: str) -> str:
        return self.part_of(self.cp_get(f"/v1/jobs/{job}")["root"])

    def job_status(self, url: str, job: str) -> dict[str, Any]:
        """A gateway's ``GET /v1/jobs/{job}`` as the admin ({} when it does not answer)."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(
                f"{url}/v1/jobs/{job}", headers=self.admin, timeout=10, verify=self.verify
            )
            if r.status_code == 200:
                body: dict[str, Any] = r.json()
                return body
        return {}

    def post_job(self, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
        """``POST /v1/jobs`` on the control plane as the admin: its answer, as it came."""
        return httpx.post(
            f"{self.p.urls['control_plane']}/v1/jobs",
            json=body,
            headers=self.admin,
            timeout=timeout,
            verify=self.verify,
        )

    def cp_get(self, path: str, timeout: float = 60.0, **kw: Any) -> dict[str, Any]:
        """GET on the control plane as the admin, riding out its restarts."""
        return retrying(
            lambda: httpx.get(
                f"{self.p.urls['control_plane']}{path}",
                headers=self.admin,
                timeout=10,
                verify=self.verify,
                **kw,
            ),
            timeout,
        )


def retrying(call: Callable[[], httpx.Response], timeout: float) -> dict[str, Any]:
    """``call`` until it answers 2xx (connection errors and 5xx retried) for ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = call()
            if r.status_code < 300:
                body: dict[str, Any] = r.json()
                return body
            if r.status_code < 500:
                raise RuntimeError(f"{r.request.url}: {r.status_code} {r.text[:300]}")
            why = f"{r.status_code} {r.text[:200]}"
        except httpx.TransportError as exc:
            why = repr(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no answer after {timeout:.0f}s: {why}")
        time.sleep(0.2)


def assigned(c: Campaign, job: str, client: str) -> tuple[str, str]:
    """``(node, gateway URL)`` the control plane assigns ``client`` (asked as the client)."""
    token = c.tokens[job][client]

    def assignment() -> httpx.Response:
        return httpx.get(
            f"{c.p.urls['control_plane']}/v1/jobs/{job}/assignment",
            params={"client": client},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            verify=c.client_tls() or True,
        )

    a = retrying(assignment, 60)
    return str(a["node"]), str(a["gateway_url"])


@dataclass
class JobRun:
    """What one job saw: the updates acknowledged per round, the fault, the checks."""

    job: str
    fault: str
    model: Model | None = None
    acked: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)  # seed, weight
    resent: int = 0
    #: updates sent again because the control plane said their node died with them
    sent_again: int = 0
    injected: dict[str, Any] = field(default_factory=dict)
    recovery_s: float | None = None
    #: time.monotonic() of the fault (the kill; for MinIO, the end of the outage)
    fault_at: float | None = None
    checks: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    #: a client whose upload waits until the fault is injected
    held: str = ""
    injected_done: threading.Event = field(default_factory=threading.Event)
    #: the gateways' fault counters before the job and what they grew by over it
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the SDK's 503 waits: (time, client) of each
    refusals: list[tuple[float, str]] = field(default_factory=list)
    #: (start, end) of each time the store was full (fault k)
    full_windows: list[tuple[float, float]] = field(default_factory=list)

    def grew(self, counter: str, node: str | None = None) -> float:
        """How much ``counter`` (a name, labels included) grew on ``node`` (all: None)."""
        return sum(
            v
            for n, d in self.counters.items()
            if node is None or n == node
            for k, v in d.items()
            if k == counter
        )


def snapshot_counters(c: Campaign) -> dict[str, dict[str, float]]:
    """Each node gateway's fault counters now (:func:`bench.fault_checks.gateway_counters`)."""
    return {n: gateway_counters(url, c.admin, c.verify) for n, url in c.nodes().items()}


def counters_grown(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {n: counter_delta(before.get(n, {}), after.get(n, {})) for n in after}


@contextlib.contextmanager
def capped_shm(where: Path, mib: int) -> Iterator[Path]:
    """A tmpfs of ``mib`` MiB mounted at ``where`` (root's ``mount``), unmounted after."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise NotRunnable(f"cannot mount a {mib} MiB tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class NotRunnable(Exception):
    """A fault this machine cannot inject (the reason is the message)."""
