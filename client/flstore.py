"""FLStore's request tracker: ask a question about a job (:func:`flstore_query`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from client.errors import from_response, unreachable
from client.tls import CaFile, verify_for

#: Tracker errors that mean "the cache engine has not ingested that round yet".
NOT_INGESTED = frozenset({"round_not_written", "unknown_job"})


def flstore_query(
    tracker_url: str,
    workload: str,
    job: str,
    *,
    rounds: list[int] | None = None,
    clients: list[str] | None = None,
    params: Mapping[str, Any] | None = None,
    token: str,
    wait: float = 120.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
) -> dict[str, Any]:
    """Ask FLStore a question about ``job``: ``POST {tracker}/v1/queries?wait=true``.

    ``token`` is the tracker's analyst (or admin) token, read from its file (the platform
    writes ``.state/secrets/analyst-token``); ``ca_file`` the platform's CA for an
    ``https://`` tracker (:mod:`client.tls`).

    ``workload`` is one of ``flstore_workloads`` (``multi-krum``, ``shapley``, ``oort``, ...),
    with its ``params``; ``rounds``/``clients`` fill the workload's round/client parameters.
    A round the cache engine has not ingested yet (the gateways checkpoint a round and tell
    the engine just after publishing it), and a tracker or engine that is restarting (a
    refused or broken connection, 502/503/504), are asked again for up to ``wait`` seconds;
    a query only reads, so asking again is safe.

    Returns
    -------
    dict
        The finished query: ``result`` (the workload's answer), ``latency_s``, ``hit``,
        ``function`` (the cache function that answered), ...

    Raises
    ------
    QueryFailed
        The tracker refused or failed the query; the error is also of its code's class
        (:func:`client.errors.query_error`), e.g. :class:`~client.errors.InvalidQuery` for
        parameters the workload refuses, :class:`~client.errors.GatewayUnavailable` for a
        tracker that stayed away (``error`` ``"unreachable"``).
    """
    query: dict[str, Any] = {"workload": workload, "job": job, "params": dict(params or {})}
    if rounds is not None:
        query["rounds"] = list(rounds)
    if clients is not None:
        query["clients"] = list(clients)
    url = tracker_url.rstrip("/") + "/v1/queries"
    deadline = time.monotonic() + wait
    verify = verify_for(ca_file)
    with httpx.Client(timeout=max(wait, 30.0), transport=transport, verify=verify) as http:
        while True:
            try:
                resp = http.post(
                    url,
                    params={"wait": "true"},
                    json=query,
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise unreachable(url, exc, "POST", query) from exc
                time.sleep(0.5)  # a tracker restarting: queries only read, so ask again
                continue
            if resp.status_code == 200:
                out: dict[str, Any] = resp.json()
                return out
            err = from_response(resp, query)
            again = err.error in NOT_INGESTED or resp.status_code in (502, 503, 504)
            if not again or time.monotonic() > deadline:
                raise err
            time.sleep(0.25)
