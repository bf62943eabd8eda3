"""bench-secagg's FedFaaS side: one secure round on ``fedfaas up --with control-plane``.

:func:`fedfaas_secagg_round` starts the one-machine platform as a user does (MinIO, Redis, the
runtime and its aggregator functions, both node gateways, the control plane; every part on a
free port, plain HTTP, ``fedfaas up --no-tls``, as Flower's side is ``--insecure``) born in the round's server cgroup,
creates a job of one round with secure aggregation (:func:`client.sdk.submit_job`), and starts
one client process per client (``python -m bench.secagg_fedfaas SPEC``, born in the clients'
cgroup). Each client runs the SDK's participant (:class:`client.secure.SecureRound`): before
the round it fetches the model (the job's parameters are in it) and maps its weights (the
harness's shared file, :mod:`bench.harness.round_clients`); it says it is ready and waits for
the harness's go, marks ``t_start_ns``, then advertises, shares its keys, masks and uploads
its update, and sends its unmask shares (a client in ``drop`` stops before that: it dropped
after sending its masked vector). Every HTTP body a client sends and receives from the go on
is counted (:class:`CountingTransport`).

The round's window runs from the first client's ``t_start_ns`` to the root gateway's
``published_ns`` (both ``CLOCK_MONOTONIC``); memory and CPU-seconds are the server cgroup's over
it (:class:`bench.harness.cgroups.RoundGroups`). The record has the published model (flat
float32) when asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from bench.harness import round_clients as rc
from bench.harness.cgroups import born_in
from bench.runinfo import PINNED_THREADS, ROOT

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups

#: the parts started, each on a free port
PORTS = ("gateway", "gateway_node1", "control_plane")
CORE_PORTS = ("runtime_port", "minio_port", "minio_console_port", "redis_port")


class CountingTransport(httpx.HTTPTransport):
    """An HTTP transport that counts the bodies' bytes it sends and receives."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = self.received = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.stream = _Counted(request.stream, self, "sent")
        response = super().handle_request(request)
        response.stream = _Counted(response.stream, self, "received")
        return response

    def reset(self) -> None:
        self.sent = self.received = 0


class _Counted(httpx.SyncByteStream):
    def __init__(self, inner: Any, counter: CountingTransport, side: str) -> None:
        self.inner, self.counter, self.side = inner, counter, side

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            setattr(self.counter, self.side, getattr(self.counter, self.side) + len(chunk))
            yield chunk

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


# ---------------------------------------------------------------------------------- a client
def client_main(spec_path: str) -> int:
    """One client's round (see the module); its marks in ``client-<cid>.out``."""
    from client.job import Job
    from client.secure import SecureRound, flatten

    spec = json.loads(Path(spec_path).read_text())
    work, cid, name = Path(spec["work"]), int(spec["cid"]), f"c{spec['cid']}"
    counter = CountingTransport()
    # the job's view the SDK polls for the round takes the admin token (as the platform test's
    # clients have it); the stages and the upload take the client's own
    job = Job(spec["url"], spec["job"], spec["admin"], created={"tokens": {name: spec["token"]}},
              transport=counter, timeout=600)  # fmt: skip
    part = SecureRound(job, name, 1, poll=0.05, timeout=spec["timeout"])
    layout, weights = rc.client_weights(work, cid)
    update = flatten({n: weights[n] for n, _ in layout})
    fetched = counter.received
    counter.reset()
    rc.wait_go(work, cid)
    t_start = time.monotonic_ns()
    with part.fl:
        part.advertise()
        part.share_keys()
        part.upload(update, 100 + cid)
        t_uploaded = time.monotonic_ns()
        if not spec["drop"]:
            part.unmask()
    marks = {
        "cid": cid,
        "t_start_ns": t_start,
        "t_uploaded_ns": t_uploaded,
        "t_end_ns": time.monotonic_ns(),
        "sent": counter.sent,
        "received": counter.received,
        "model_fetched": fetched,
        "dropped": bool(spec["drop"]),
    }
    (work / f"client-{cid}.out").write_text(json.dumps(marks))
    return 0


# ---------------------------------------------------------------------------------- the round
def _cli(state_dir: Path, args: list[str], env: Mapping[str, str], timeout: float) -> None:
    cmd = [sys.executable, "-m", "fedfaas.cli", *args, "--state-dir", str(state_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"fedfaas {args[0]} exited {out.returncode}: {out.stderr[-2000:]}")


def _platform_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENFAAS_URL"}
    env["FEDFAAS_PORTS"] = json.dumps(dict.fromkeys(PORTS, 0))
    env.update({f"FEDFAAS_{k.upper()}": "0" for k in CORE_PORTS})
    return env


def fedfaas_secagg_round(
    num_clients: int,
    layout: Sequence[tuple[str, Sequence[int]]],
    spec: Mapping[str, Any],
    drop: Sequence[int] = (),
    *,
    groups: RoundGroups | None = None,
    timeout: float = 900.0,
    keep_model: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """One secure round of ``num_clients`` clients of ``layout``'s float32 weights under the
    job parameters ``spec`` (:class:`core.secagg.config.SecAggConfig`), clients ``drop``
    stopping before unmasking. Returns ``{"ok": True, "e2e_s", "cgroup", "clients", ...}``
    or ``{"ok": False, "failure", "detail"}``."""
    from safetensors.numpy import save

    from client.sdk import submit_job
    from fedfaas.platform import state

    layout = [(n, list(s)) for n, s in layout]
    base = {"num_clients": num_clients, "update_bytes": rc.layout_bytes(layout),
            "dropped": sorted(drop)}  # fmt: skip
    env = _platform_env()
    with tempfile.TemporaryDirectory(prefix="secagg-bench-") as tmp:
        root = Path(tmp)
        state_dir, work = root / "state", root / "work"
        work.mkdir()
        shared = Path(f"/dev/shm/fedfaas-bench-secagg-{os.getpid()}-{time.monotonic_ns()}")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with born_in(groups.server if groups is not None else None):
                _cli(state_dir, ["up", "--with", "control-plane", "--no-tls"], env, 600)
            st = state.load(state_dir)
            assert st is not None
            ports: dict[str, int] = {}
            for rec in st.services:
                ports.update(rec.ports)
            host = st.host
            cp = f"http://{host}:{ports['control_plane']}"
            gateways = [f"http://{host}:{ports[g]}" for g in ("gateway", "gateway_node1")]
            admin = (state_dir / "secrets" / "gateway-admin-secret").read_text().strip()
            rc.share_weights(work, layout, seed=seed, shared=shared, weights=None)
            ids = [f"c{k}" for k in range(num_clients)]
            initial = save({n: np.zeros(s, np.float32) for n, s in layout})
            job = submit_job(cp, "secagg", initial, rounds=1, clients=ids, admin_token=admin,
                             secure_aggregation=dict(spec), deadline_s=timeout)  # fmt: skip
            for k, c in enumerate(ids):
                sp = work / f"spec-{k}.json"
                sp.write_text(json.dumps({
                    "work": str(work), "cid": k, "url": cp, "job": "secagg",
                    "token": job.token_of(c), "admin": admin, "drop": k in drop, "timeout": timeout,
                }))  # fmt: skip
                with (
                    open(work / f"client-{k}.log", "wb") as log,
                    born_in(groups.clients if groups is not None else None),
                ):
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "bench.secagg_fedfaas", str(sp)], cwd=ROOT,
                        env={**os.environ, **PINNED_THREADS, "PYTHONPATH": str(ROOT)},
                        stdout=log, stderr=subprocess.STDOUT,
                    ))  # fmt: skip
            deadline = time.monotonic() + timeout
            while len(list(work.glob("ready-*"))) < num_clients:
                _check(procs, work, deadline)
                time.sleep(0.01)
            if groups is not None:
                groups.open_window()
            (work / "go").touch()
            published = _published(cp, gateways, admin, procs, work, deadline)
            acct = groups.close_window() if groups is not None else None
            for p in procs:
                p.wait(timeout)
            marks = [json.loads((work / f"client-{k}.out").read_text()) for k in range(num_clients)]
            model = job.model(version=1).data if keep_model else None
        except RuntimeError as exc:
            return {"ok": False, "failure": "error", "detail": str(exc)[-3000:], **base}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            shared.unlink(missing_ok=True)
            if state.load(state_dir) is not None:
                _cli(state_dir, ["down"], env, 600)
    start = min(m["t_start_ns"] for m in marks)
    out: dict[str, Any] = {
        "ok": True,
        **base,
        "e2e_s": (published - start) / 1e9,
        "upload_s": (max(m["t_uploaded_ns"] for m in marks) - start) / 1e9,
        "clients": marks,
    }
    if acct is not None:
        out["cgroup"] = acct
    if model is not None:
        from client.secure import flatten, unflatten

        out["model"] = flatten(unflatten(model))
    return out


def _published(
    cp: str,
    gateways: Sequence[str],
    admin: str,
    procs: Sequence[subprocess.Popen[bytes]],
    work: Path,
    deadline: float,
) -> int:
    """The root gateway's ``published_ns`` of round 1, once it published it; ``RuntimeError``
    when the job failed (the control plane's view says why), a client failed or the round ran
    past ``deadline``."""
    with httpx.Client(headers={"Authorization": f"Bearer {admin}"}, timeout=30) as http:
        while True:
            _check(procs, work, deadline, finished_ok=True)
            for gw in gateways:
                got = http.get(f"{gw}/v1/jobs/secagg").json()
                published = int((got.get("last_round") or {}).get("published_ns") or 0)
                if published:
                    return published
            failed = http.get(f"{cp}/v1/jobs/secagg").json().get("failed")
            if failed:
                raise RuntimeError(f"the job failed: {failed}")
            time.sleep(0.02)


def _check(
    procs: Sequence[subprocess.Popen[bytes]], work: Path, deadline: float, finished_ok: bool = False
) -> None:
    """``RuntimeError`` when a client failed or the round ran past ``deadline``."""
    for k, p in enumerate(procs):
        rc_ = p.poll()
        if rc_ is not None and (rc_ != 0 or not finished_ok):
            log = (work / f"client-{k}.log").read_text(errors="replace")[-2500:]
            raise RuntimeError(f"client {k} exited {rc_}: {log}")
    if time.monotonic() > deadline:
        raise RuntimeError("no published model before the deadline")


if __name__ == "__main__":
    raise SystemExit(client_main(sys.argv[1]))
