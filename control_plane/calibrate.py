"""Measure a node's maximum service capacity MC (LIFL appendix E).

Procedure: raise the load on one node step by step (``levels`` concurrent updates); at each
step measure the arrival rate ``k`` (updates / second the node took) and ``E`` (mean seconds
from sending an update until it is aggregated). The first step where ``E`` grows beyond
``threshold`` times its unloaded value is the knee ``(k', E')`` and ``MC = k' * E'`` (by
Little's law, the number of updates the node holds in flight at that load).

:func:`find_knee` is the pure part; :func:`calibrate` drives a node gateway over HTTP
(``fedfaas calibrate`` is the CLI front of it). ``E`` here is the sojourn time of an update
(upload start to model published), so MC counts what the whole node path sustains.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from control_plane.errors import GatewayError, InvalidInput
from core.tls import client_context

log = logging.getLogger(__name__)

#: ``send_batch(n) -> per-update seconds from send to aggregated``, for n concurrent updates.
BatchSender = Callable[[int], Awaitable[Sequence[float]]]


@dataclass(frozen=True)
class Calibration:
    """Result of a calibration.

    Attributes
    ----------
    mc
        ``k' * E'`` at the knee (or at the last level when no knee was seen).
    knee_level
        Concurrency at the knee, None when E never degraded (``mc`` is then a lower bound).
    levels, rates, exec_times
        What was measured at each level.
    """

    mc: float
    knee_level: int | None
    levels: tuple[int, ...]
    rates: tuple[float, ...]
    exec_times: tuple[float, ...]


def find_knee(
    levels: Sequence[int],
    rates: Sequence[float],
    exec_times: Sequence[float],
    threshold: float = 1.5,
) -> Calibration:
    """Find the first level whose ``E`` exceeds ``threshold`` x the first level's ``E``.

    Parameters
    ----------
    levels
        Concurrency of each step (increasing).
    rates
        ``k`` at each step (updates per second).
    exec_times
        ``E`` at each step (seconds per update, send to aggregated).
    threshold
        How much slower counts as "a significant increase" (> 1).
    """
    if not (len(levels) == len(rates) == len(exec_times)) or not levels:
        raise InvalidInput("levels, rates and exec_times must be non-empty and of equal length")
    if threshold <= 1.0:
        raise InvalidInput("threshold must be > 1")
    if any(x <= 0 for x in (*rates, *exec_times)) or list(levels) != sorted(levels):
        raise InvalidInput("rates and exec_times must be > 0 and levels increasing")
    base = exec_times[0]
    for i, e in enumerate(exec_times):
        if e > threshold * base:
            return Calibration(
                rates[i] * e, int(levels[i]), tuple(levels), tuple(rates), tuple(exec_times)
            )
    return Calibration(
        rates[-1] * exec_times[-1], None, tuple(levels), tuple(rates), tuple(exec_times)
    )


async def measure(
    send_batch: BatchSender,
    levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    threshold: float = 1.5,
    repeats: int = 2,
    stop_at_knee: bool = True,
) -> Calibration:
    """Run the step procedure with ``send_batch`` and return the calibration."""
    lv: list[int] = []
    ks: list[float] = []
    es: list[float] = []
    for n in levels:
        if n < 1:
            raise InvalidInput("levels must be >= 1")
        walls, execs = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            per_update = list(await send_batch(n))
            walls.append(time.perf_counter() - t0)
            execs.extend(per_update)
        wall = float(np.median(walls))
        lv.append(n)
        ks.append(n / wall)
        es.append(float(np.mean(execs)))
        log.info("calibrate: %d concurrent -> k=%.2f/s E=%.4fs", n, ks[-1], es[-1])
        if stop_at_knee and len(es) > 1 and es[-1] > threshold * es[0]:
            break
    return find_knee(lv, ks, es, threshold)


def calibrate(
    gateway_url: str,
    *,
    initial_weights: bytes,
    update: bytes,
    admin_token: str,
    levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
    threshold: float = 1.5,
    repeats: int = 2,
    job_prefix: str = "calibrate",
    timeout: float = 120.0,
    ca_file: Path | None = None,
) -> float:
    """Measure MC of the node behind ``gateway_url`` (``fedfaas calibrate``).

    For each level ``n`` (and repeat) a one-round job with goal ``n`` is created on the
    gateway (``POST /v1/jobs`` with ``initial_weights`` and the admin token; the answer
    carries the client tokens), ``n`` copies of ``update`` are uploaded concurrently
    (``POST /v1/jobs/{job}/rounds/1/updates``), and the model is polled until its version
    is 1. An update's ``E`` is the time from its send to that moment.

    Parameters
    ----------
    gateway_url
        The node gateway.
    initial_weights, update
        The model's initial weights and one update, both safetensors (same spec).
    admin_token
        The gateway's admin secret (``<state_dir>/admin-secret``).
    levels, threshold, repeats
        See :func:`measure`.
    ca_file
        The CA an ``https`` gateway is verified against (``fedfaas up --tls``: the
        platform's ``secrets/tls/ca.crt``); ``None``: the system's CAs.

    Returns
    -------
    float
        MC in updates (``k' * E'``).
    """
    return asyncio.run(
        measure_gateway(
            gateway_url,
            initial_weights,
            update,
            admin_token,
            levels,
            threshold,
            repeats,
            job_prefix,
            timeout,
            ca_file,
        )
    ).mc


async def measure_gateway(
    gateway_url: str,
    initial_weights: bytes,
    update: bytes,
    admin_token: str,
    levels: Sequence[int],
    threshold: float,
    repeats: int,
    job_prefix: str,
    timeout: float,
    ca_file: Path | None = None,
) -> Calibration:
    """:func:`calibrate` as a coroutine returning the whole :class:`Calibration`."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    tag = os.urandom(3).hex()
    counter = 0
    # a gateway over https is verified against the platform's CA (TLS 1.2+, its host name)
    verify = client_context(ca_file) if ca_file is not None else True
    async with httpx.AsyncClient(
        base_url=gateway_url.rstrip("/"), timeout=timeout, verify=verify
    ) as http:

        async def send_batch(n: int) -> list[float]:
            nonlocal counter
            counter += 1
            name = f"{job_prefix}-{tag}-{counter}"[:40]
            clients = [f"cal{i}" for i in range(n)]
            params = {"job": name, "rounds": "1", "goal": str(n), "clients": ",".join(clients)}
            r = await http.post("/v1/jobs", params=params, content=initial_weights, headers=admin)
            if r.status_code >= 300:
                raise GatewayError(
                    gateway_url, f"POST /v1/jobs answered {r.status_code}: {r.text[:200]}"
                )
            tokens = r.json().get("tokens", {})
            starts: list[float] = []

            async def one(c: str) -> None:
                starts.append(time.perf_counter())
                resp = await http.post(
                    f"/v1/jobs/{name}/rounds/1/updates",
                    content=update,
                    headers={
                        "X-Client-Id": c,
                        "X-Sample-Count": "1",
                        "Authorization": f"Bearer {tokens.get(c, '')}",
                    },
                )
                if resp.status_code >= 300:
                    raise GatewayError(
                        gateway_url, f"upload answered {resp.status_code}: {resp.text[:200]}"
                    )

            await asyncio.gather(*(one(c) for c in clients))
            deadline = time.perf_counter() + timeout
            while True:
                st = await http.get(f"/v1/jobs/{name}", headers=admin)
                if st.status_code == 200 and int(st.json().get("version", 0)) >= 1:
                    break
                if time.perf_counter() > deadline:
                    raise GatewayError(gateway_url, f"model of {name} not published in {timeout}s")
                await asyncio.sleep(0.002)
            done = time.perf_counter()
            return [done - t for t in starts]

        return await measure(send_batch, levels, threshold=threshold, repeats=repeats)
