"""HTTP client of the node gateways, plus the plan -> gateway slot table conversion.

Only the gateway's public HTTP API is used (``gateway/`` internals are not a contract):

* ``GET  /healthz``
* ``POST /v1/jobs?job=&rounds=&goal=&clients=`` (clients comma-separated); the answer carries
  the job's ``salt`` (the clients' tokens depend on it)
* ``GET  /v1/jobs/{job}`` (job status; read tolerantly, see :class:`GatewayJobStatus`)
* ``PUT  /v1/jobs/{job}/rounds/{r}/plan`` (the slot table of :func:`plan_to_slots`; a gateway
  without it answers 404/405 and keeps its own static plan)
* ``POST /v1/jobs/{job}/rounds/{r}/close`` (optional ``{"received": {node: n}}``): stop the
  round's intake and aggregate what reached the listed nodes
* ``DELETE /v1/jobs/{job}``: delete the job
* ``DELETE /v1/jobs/{job}/clients/{client}?force=true``: revoke one client

Every request carries the admin bearer token given to :class:`GatewayClient` (the gateways'
admin secret; every gateway route but ``/healthz`` needs it).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from control_plane.errors import GatewayBusy, GatewayError
from control_plane.planning import Plan, leaf_id, middle_id
from core import server_names

log = logging.getLogger(__name__)

#: Slot roles as in the sidecar frame's TASK flags (1 leaf, 2 middle, 3 top).
ROLE_CODE = {"leaf": 1, "middle": 2, "top": 3}


@dataclass(frozen=True)
class GatewayJobStatus:
    """What the coordinator needs from ``GET /v1/jobs/{job}``.

    Read tolerantly because the gateway's answer may grow: ``round`` (current round),
    ``received``/``accepted``/``updates`` (updates accepted in that round), ``version``
    (global model version), ``queue`` (pending updates: ``k * E``), ``salt`` (the job's, which
    the gateway shows the admin; None when absent), ``plan_version`` (the pushed plan the open
    round runs; None when it runs the gateway's own plan, or the gateway does not say),
    ``last_published`` (from ``last_round``), ``dropped`` (acknowledged updates in no
    published model, from ``dropped.recent``).
    """

    round: int
    received: int
    version: int
    queue: float
    reports_version: bool = False
    salt: str | None = None
    plan_version: int | None = None
    #: ``(round, updates)`` of the last round this gateway published (the root), if any
    last_published: tuple[int, int] | None = None
    #: ``(round, slot, updates)`` of the acknowledged updates this gateway reports in no
    #: published model (its ``dropped.recent``)
    dropped: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GatewayJobStatus:
        def num(*keys: str) -> float:
            for k in keys:
                v = data.get(k)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    return float(v)
                if isinstance(v, list):
                    return float(len(v))
            return 0.0

        return cls(
            round=int(num("round", "current_round")),
            received=int(num("received", "accepted", "updates", "count")),
            version=int(num("version", "model_version")),
            queue=num("queue", "queue_length", "pending"),
            reports_version="version" in data or "model_version" in data,
            salt=data["salt"] if isinstance(data.get("salt"), str) else None,
            plan_version=pv
            if isinstance(pv := data.get("plan_version"), int)
            and not isinstance(pv, bool)
            and data.get("pushed_plan", True)
            else None,
            last_published=_last_published(data.get("last_round")),
            dropped=_dropped(data.get("dropped")),
        )


def _dropped(dropped: Any) -> tuple[tuple[int, int, int], ...]:
    recent = dropped.get("recent") if isinstance(dropped, dict) else None
    out: list[tuple[int, int, int]] = []
    for d in recent if isinstance(recent, list) else ():
        vals = [d.get(k) for k in ("round", "slot", "updates")] if isinstance(d, dict) else []
        ints = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) == 3:
            out.append((ints[0], ints[1], ints[2]))
    return tuple(out)


def _last_published(last: Any) -> tuple[int, int] | None:
    if not isinstance(last, dict) or not last.get("published_ns"):
        return None
    rnd, count = last.get("round"), last.get("count")
    if isinstance(rnd, int) and isinstance(count, int) and count > 0:
        return rnd, count
    return None


class GatewayClient:
    """Async client of one node gateway; ``admin_token`` goes with every request."""

    def __init__(
        self,
        node: str,
        url: str,
        *,
        admin_token: str | None = None,
        timeout: float = 5.0,
        health_timeout: float = 1.0,
        create_timeout: float = 180.0,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        tls_name: str | None = None,
    ) -> None:
        self.node = node
        self.url = url.rstrip("/")
        self.health_timeout = health_timeout
        self.create_timeout = create_timeout
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        if tls_name is not None:  # its certificate verified against tls_name, not the host
            inner = transport or httpx.AsyncHTTPTransport(verify=verify)
            transport = server_names.ServerNames(inner, {server_names.origin(self.url): tls_name})
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, transport=transport, headers=headers, verify=verify
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def healthz(self) -> dict[str, Any] | None:
        """The ``GET /healthz`` body when it answers 200 within the health timeout, else None."""
        try:
            r = await self._client.get("/healthz", timeout=self.health_timeout)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            body = r.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    async def create_job(
        self,
        job: str,
        rounds: int,
        goal: int,
        clients: Sequence[str],
        *,
        nodes: Sequence[str] | None = None,
        body: bytes = b"",
    ) -> tuple[str, dict[str, Any]]:
        """Create the job on this gateway.

        The real gateway creates a job on its root node (``nodes[0]``) from the initial weights
        (safetensors ``body``); the other nodes learn it from the journal. Returns ``("created", answer)``, ``("exists", {})`` (409: attach to it) or
        ``("not_root", {})`` (the gateway says to create it on the root).
        """
        params = {
            "job": job,
            "rounds": str(rounds),
            "goal": str(goal),
            "clients": ",".join(clients),
        }
        if nodes:
            params["nodes"] = ",".join(nodes)
        # creating a job pre-faults the node's buffer pool: give it time on a busy machine
        r = await self._request(
            "POST",
            "/v1/jobs",
            params=params,
            content=body,
            timeout=self.create_timeout,
        )
        if r.status_code == 409:
            return "exists", {}
        data: dict[str, Any] = {}
        try:
            parsed = r.json()
            if isinstance(parsed, dict):
                data = parsed
        except ValueError:
            pass
        if r.status_code >= 300:
            if data.get("error") == "wrong_node":
                return "not_root", data
            what = f"POST /v1/jobs answered {r.status_code}: {r.text[:300]}"
            after = r.headers.get("retry-after", "")
            if r.status_code == 503 and after.isdigit():  # e.g. store_full: nothing kept
                raise GatewayBusy(
                    self.node, what, error=str(data.get("error", "")), retry_after=int(after)
                )
            raise GatewayError(self.node, what, error=str(data.get("error", "")))
        return "created", data

    async def job_known(self, job: str) -> tuple[bool, str]:
        """``(True, "")`` when ``GET /v1/jobs/{job}`` answers 200, else ``(False, what it
        answered)``."""
        r = await self._request("GET", f"/v1/jobs/{job}")
        if r.status_code == 200:
            return True, ""
        return False, f"HTTP {r.status_code} {r.text[:200]}"

    async def job_status(self, job: str) -> GatewayJobStatus:
        """``GET /v1/jobs/{job}``."""
        r = await self._request("GET", f"/v1/jobs/{job}")
        if r.status_code != 200:
            raise GatewayError(self.node, f"GET /v1/jobs/{job} answered {r.status_code}")
        try:
            return GatewayJobStatus.from_json(r.json())
        except ValueError as exc:
            raise GatewayError(self.node, f"GET /v1/jobs/{job}: not JSON ({exc})") from exc

    async def put_plan(self, job: str, round_: int, slots: Mapping[str, Any]) -> bool:
        """Send the round's slot table; False when the gateway does not take plans (yet)."""
        r = await self._request("PUT", f"/v1/jobs/{job}/rounds/{round_}/plan", json=slots)
        if r.status_code == 404 and _error(r) == "unknown_job":
            raise GatewayError(self.node, f"PUT plan: job {job!r} unknown there")
        if r.status_code in (404, 405):
            log.debug("gateway %s does not take plans (HTTP %d)", self.node, r.status_code)
            return False
        if r.status_code >= 300:
            raise GatewayError(self.node, f"PUT plan answered {r.status_code}: {r.text[:200]}")
        return True

    async def close_round(
        self,
        job: str,
        round_: int,
        received: Mapping[str, int] | None = None,
    ) -> dict[str, Any] | None:
        """Close the round's intake (and with ``received``, aggregate those updates).

        Returns the gateway's answer (``received`` = its accepted updates), or None when the
        gateway has no close route. Raises :class:`GatewayError` with the gateway's error
        code in ``error`` (``stale_round``: the round is over there) when it refuses.
        """
        kw: dict[str, Any] = {}
        if received is not None:
            kw["json"] = {"received": dict(received)}
        r = await self._request("POST", f"/v1/jobs/{job}/rounds/{round_}/close", **kw)
        if r.status_code in (404, 405) and _error(r) != "unknown_job":
            return None
        if r.status_code >= 300:
            raise GatewayError(
                self.node, f"close answered {r.status_code}: {r.text[:300]}", error=_error(r)
            )
        data = r.json()
        return data if isinstance(data, dict) else None

    async def adopt(self, job: str, dead: str) -> dict[str, Any]:
        """Have this gateway take ``job`` over from its dead root node ``dead``
        (:mod:`gateway.takeover`). Returns its answer: ``version``, the open ``round`` and
        ``resend``, the clients whose updates were lost with ``dead``.

        Raises :class:`GatewayError` with the gateway's error code in ``code`` when it
        cannot (``model_lost``, ``not_root``, ...).
        """
        r = await self._request("POST", f"/v1/jobs/{job}/adopt", json={"from": dead})
        if r.status_code >= 300:
            raise GatewayError(
                self.node, f"adopt answered {r.status_code}: {r.text[:300]}", error=_error(r)
            )
        data = r.json()
        if not isinstance(data, dict) or not isinstance(data.get("resend"), list):
            raise GatewayError(self.node, f"adopt answered {r.text[:300]}")
        return data

    async def delete_job(self, job: str) -> bool:
        """``DELETE /v1/jobs/{job}`` here (on its root, the journal goes too); False when this
        gateway does not know the job."""
        r = await self._request("DELETE", f"/v1/jobs/{job}")
        if r.status_code == 404:
            return False
        if r.status_code >= 300:
            raise GatewayError(self.node, f"delete answered {r.status_code}: {r.text[:300]}")
        return True

    async def revoke_client(self, job: str, client: str) -> bool:
        """Revoke ``client`` of ``job`` here (forced: the coordinator checks the goal itself).

        False when this gateway does not know the job (nothing to revoke there).
        """
        r = await self._request(
            "DELETE", f"/v1/jobs/{job}/clients/{client}", params={"force": "true"}
        )
        if r.status_code == 404 and _error(r) == "unknown_job":
            return False
        if r.status_code >= 300:
            raise GatewayError(self.node, f"revoke answered {r.status_code}: {r.text[:300]}")
        return True

    async def unmask_state(self, job: str, round_: int) -> dict[str, Any]:
        """``GET /v1/jobs/{job}/rounds/{r}/unmask`` on the job's root: whose masked vectors
        the round's sum holds, once it waits for their shares (:mod:`gateway.unmask`)."""
        r = await self._request("GET", f"/v1/jobs/{job}/rounds/{round_}/unmask")
        if r.status_code >= 300:
            raise GatewayError(self.node, f"unmask state answered {r.status_code}: {r.text[:300]}")
        return dict(r.json())

    async def unmask(self, job: str, round_: int, material: Mapping[str, Any]) -> str | None:
        """``POST`` the round's adverts, who shared and the survivors' shares to the root,
        which unmasks and publishes: None once it did, the reason when the round cannot be
        unmasked (409 ``unmask_failed``)."""
        r = await self._request(
            "POST",
            f"/v1/jobs/{job}/rounds/{round_}/unmask",
            json=dict(material),
            timeout=self.create_timeout,
        )
        if r.status_code == 409 and _error(r) == "unmask_failed":
            return str(r.json().get("detail", ""))
        if r.status_code >= 300:
            raise GatewayError(self.node, f"unmask answered {r.status_code}: {r.text[:300]}")
        return None

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise GatewayError(self.node, f"{method} {self.url}{path}: {exc!r}") from exc


def _error(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return ""
    return str(data.get("error", "")) if isinstance(data, dict) else ""


def plan_to_slots(
    plan: Plan,
    client_nodes: Mapping[str, str] | None = None,
    ids: dict[str, int] | None = None,
    excluded: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The plan as the gateway's slot table: ``{"slots": [...], "client_nodes": {...}}``.

    Slot ids are positive ints (top = 1, then middles, then leaves, in plan order); ``goal``
    counts the client updates under a slot (so a middle's goal is its leaves' updates and the
    top's the round's), ``role`` is 1 leaf / 2 middle / 3 top, ``parent`` the parent slot id.
    Pass the same ``ids`` dict (aggregator id -> slot id, updated in place) for every plan of
    a round, so a re-planned aggregator keeps its slot id and new ones get fresh ids.
    ``excluded`` (clients dropped before aggregation, and why) travels as is.
    """
    extra = {"excluded": dict(excluded)} if excluded else {}
    if plan.top_node is None:
        return {
            "slots": [],
            "client_nodes": dict(client_nodes or {}),
            "version": plan.version,
            **extra,
        }
    if ids is None:
        ids = {}
    ids.setdefault("top", 1)

    def sid(name: str) -> int:
        if name not in ids:
            ids[name] = max(ids.values()) + 1
        return ids[name]

    slots: list[dict[str, Any]] = [
        {
            "id": 1,
            "node": plan.top_node,
            "role": ROLE_CODE["top"],
            "goal": plan.goal,
            "parent": None,
        }
    ]
    for n in plan.nodes:
        for m, (_, updates) in n.generations().items():
            slots.append(
                {
                    "id": sid(middle_id(n.node, m)),
                    "node": n.node,
                    "role": ROLE_CODE["middle"],
                    "goal": updates,
                    "parent": 1,
                }
            )
    for n in plan.nodes:
        for k, g, m in zip(n.leaf_numbers, n.leaf_goals, n.middles, strict=True):
            slots.append(
                {
                    "id": sid(leaf_id(n.node, k)),
                    "node": n.node,
                    "role": ROLE_CODE["leaf"],
                    "goal": g,
                    "parent": ids[middle_id(n.node, m)],
                }
            )
    return {
        "slots": slots,
        "client_nodes": dict(client_nodes or {}),
        "version": plan.version,
        **extra,
    }
