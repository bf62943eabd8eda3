"""A job's rounds through one in-process gateway (``GatewayThread``): create the job, upload
the clients' updates, wait for the global model, and the flat FedAvg that it must equal."""

from __future__ import annotations

import time

import httpx
import numpy as np

from client.sdk import with_metadata
from core import fedavg, wire
from core.auth import bearer
from tests.dataplane.gwutil import GatewayThread, tiny_model


def create(
    gw: GatewayThread,
    clients: list[str],
    goal: int,
    rounds: int = 1,
    name: str = "j1",
    nodes: str | None = None,
) -> dict:
    """Create job ``name`` from ``tiny_model(0)`` (its round 1 spread over ``nodes``, when
    given); the gateway's answer."""
    extra = {"nodes": nodes} if nodes else {}
    r = job_request(gw.url, gw.gw.secret, clients, goal, rounds, job=name, **extra)
    assert r.status_code == 201, r.text
    return dict(r.json())


def job_request(
    url: str,
    secret: str,
    clients: list[str],
    goal: int,
    rounds: int = 1,
    *,
    job: str = "j1",
    metadata: dict[str, str] | None = None,
    **params: str,
) -> httpx.Response:
    """``POST /v1/jobs`` of ``job`` as the admin (``secret``), its first model ``tiny_model(0)``
    with ``metadata`` in its header (``client.sdk.with_metadata``); the answer."""
    body = wire.encode_tensors(tiny_model(0))
    return httpx.post(
        url + "/v1/jobs",
        params={"job": job, "rounds": rounds, "goal": goal, "clients": ",".join(clients), **params},
        content=with_metadata(body, metadata) if metadata else body,
        headers=bearer(secret),
    )


def upload(
    url: str, tokens: dict[str, str], client: str, rnd: int, seed: int, samples: int
) -> None:
    upload_to(url, "j1", tokens, client, rnd, seed, samples)


def upload_to(
    url: str, job: str, tokens: dict[str, str], client: str, rnd: int, seed: int, samples: int
) -> None:
    body = wire.encode_tensors(tiny_model(seed, 3.0))
    r = post_update(url, job, rnd, tokens[client], client, body, samples)
    assert r.status_code == 202, r.text


def post_update(
    url: str,
    job: str,
    rnd: int,
    token: str,
    client: str,
    body: bytes,
    samples: int | str = 1,
    timeout: float = 30,
) -> httpx.Response:
    """POST ``client``'s update ``body`` of round ``rnd`` with its ``token``; the answer."""
    return httpx.post(
        f"{url}/v1/jobs/{job}/rounds/{rnd}/updates",
        content=body,
        headers={
            "Authorization": f"Bearer {token}",
            "X-Client-Id": client,
            "X-Sample-Count": str(samples),
        },
        timeout=timeout,
    )


def wait_version(
    url: str, token: str, version: int, timeout: float = 60, job: str = "j1"
) -> dict[str, np.ndarray]:
    """Model ``version`` (or newer) of ``job`` as served at ``url``: a 503 with Retry-After
    (a non-root node still fetching it from its root) is asked again; any 200 must carry a
    body that parses as safetensors, whatever its version."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/v1/jobs/{job}/model", headers={"Authorization": f"Bearer {token}"})
        if r.status_code == 503 and "retry-after" in r.headers:
            time.sleep(0.05)
            continue
        assert r.status_code == 200, r.text
        served = int(r.headers["x-model-version"])
        assert r.content, f"200 with X-Model-Version {served} and an empty body"
        model = wire.decode_tensors(r.content)
        if served >= version:
            return model
        time.sleep(0.05)
    raise TimeoutError(f"model version {version} not reached")


def expected(seeds: list[int], weights: list[int]) -> dict[str, np.ndarray]:
    models = [tiny_model(s, 3.0) for s in seeds]
    return {
        k: fedavg.fedavg_reference([m[k].astype(np.float32) for m in models], weights)
        for k in models[0]
    }


def assert_fedavg(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for k in ("layer.weight", "layer.bias"):
        assert fedavg.rel_error(got[k], want[k]) <= 1e-6, k


def assert_job_refused(
    gw: GatewayThread, clients: list[str], metadata: dict[str, str], error: str, says: str
) -> None:
    """A job of ``clients`` (goal 3) whose model carries ``metadata`` is refused with a 400
    ``error`` whose detail says ``says``, and nothing of it is created."""
    r = job_request(gw.url, gw.gw.secret, clients, 3, metadata=metadata)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == error and says in r.json()["detail"]
    assert httpx.get(gw.url + "/v1/jobs/j1", headers=bearer(gw.gw.secret)).status_code == 404
    assert "j1" not in gw.gw.jobs
