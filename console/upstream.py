"""What the console reads from the platform's services, through their own JSON APIs.

Reads go with the analyst token (read-only everywhere), so the console can show nothing an
analyst could not ask for; the admin's state changes and the admin-only reads (the gateways'
router tables) go with the token the admin logged in with. An answer a service refuses or
cannot give becomes :class:`UpstreamError`, which the console answers as JSON with the
service's status (or 502 when it did not answer) and what it said.
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from console import dataplane
from console.settings import ConsoleSettings
from core.auth import bearer, read_token_file
from core.openfaas import read_basic_auth

log = logging.getLogger(__name__)

#: the metric of the control plane that names every job it knows (a job list for the analyst)
JOBS_METRIC = "fedfaas_control_job_rounds_completed"
#: the function whose replicas run every aggregation, and the prefix of FLStore's functions
AGGREGATOR = "aggregator"
FLSTORE_PREFIX = "flstore-"
#: seconds of samples a Prometheus rate is taken over (its scrapes every second or so)
PROMETHEUS_WINDOW_S = 30


class UpstreamError(Exception):
    """A service refused or did not answer; ``status`` and ``body`` are what the console
    answers (the service's own JSON error where it sent one)."""

    def __init__(self, status: int, service: str, detail: Any) -> None:
        super().__init__(f"{service}: {detail}")
        self.status = status
        self.body = {"error": "upstream", "service": service, "detail": detail}


def version() -> str:
    """The platform's version (the installed ``fedfaas`` distribution)."""
    try:
        return metadata.version("fedfaas")
    except metadata.PackageNotFoundError:
        return "unknown"


class Upstream:
    """The services behind the console, with the console's read credentials."""

    def __init__(self, settings: ConsoleSettings, timeout: float = 10.0) -> None:
        self.settings = settings
        self.analyst = (
            read_token_file(settings.analyst_token_file, "analyst token")
            if settings.analyst_token_file is not None
            else None
        )
        self.runtime_auth = (
            read_basic_auth(settings.runtime_auth_dir) if settings.runtime_auth_dir else None
        )
        tls = settings.tls()
        self.http = httpx.AsyncClient(
            timeout=timeout,
            trust_env=False,
            verify=tls.client_context() if tls is not None else True,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def _reader(self) -> dict[str, str]:
        if self.analyst is None:
            raise UpstreamError(503, "console", "no analyst token file: the console cannot read")
        return bearer(self.analyst)

    async def _call(
        self,
        service: str,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        **kw: Any,
    ) -> httpx.Response:
        try:
            r = await self.http.request(
                method, url, headers=headers, timeout=timeout or self.http.timeout, **kw
            )
        except httpx.HTTPError as exc:
            raise UpstreamError(502, service, f"{method} {url}: no answer ({exc!r})") from exc
        if r.status_code >= 400:
            try:
                detail: Any = r.json()
            except ValueError:
                detail = r.text[:500]
            raise UpstreamError(r.status_code, service, detail)
        return r

    async def _json(self, service: str, method: str, url: str, **kw: Any) -> Any:
        r = await self._call(service, method, url, **kw)
        try:
            return r.json()
        except ValueError as exc:
            raise UpstreamError(502, service, f"{method} {url}: not JSON") from exc

    # --- health and the overview ----------------------------------------------------------

    async def health(self, url: str) -> dict[str, Any]:
        """``GET url/healthz``: ``{"ok": bool, "detail": ...}`` (never raises)."""
        try:
            r = await self.http.get(f"{url}/healthz", timeout=3.0)
            body: Any = (
                r.json()
                if r.headers.get("content-type", "").startswith("application/json")
                else r.text
            )
            return {"ok": r.status_code == 200, "detail": body}
        except httpx.HTTPError as exc:
            return {"ok": False, "detail": repr(exc)}

    async def functions(self) -> list[dict[str, Any]]:
        """The provider's functions (``GET /system/functions``): name, replicas, ready ones."""
        auth = httpx.BasicAuth(*self.runtime_auth) if self.runtime_auth else None
        raw = await self._json(
            "runtime", "GET", f"{self.settings.runtime_url}/system/functions", auth=auth
        )
        return sorted(
            (
                {
                    "name": str(f.get("name")),
                    "replicas": int(f.get("replicas") or 0),
                    "available": int(f.get("availableReplicas") or 0),
                    "image": str(f.get("image") or ""),
                }
                for f in raw
                if isinstance(f, dict)
            ),
            key=lambda f: f["name"],
        )

    async def router(self, url: str, admin_token: str) -> dict[str, Any]:
        """A gateway's ``/v1/router`` (admin): its endpoints with their kernel counters."""
        out: dict[str, Any] = await self._json(
            "gateway", "GET", f"{url}/v1/router", headers=bearer(admin_token)
        )
        return out

    async def overview(self, admin_token: str | None) -> dict[str, Any]:
        """Nodes, gateways (router mode, aggregators), functions, each service's health."""
        s = self.settings
        gateways = s.gateway_map()
        services = {
            "control-plane": s.control_plane_url,
            "request-tracker": s.tracker_url,
            "runtime": s.runtime_url,
            **{f"gateway {n}": u for n, u in gateways.items()},
        }
        checks = await asyncio.gather(*(self.health(u) for u in services.values()))
        health = {
            name: {"url": u, **c} for (name, u), c in zip(services.items(), checks, strict=True)
        }
        out: dict[str, Any] = {"version": version(), "health": health, "errors": []}
        try:
            out["nodes"] = await self._json(
                "control-plane", "GET", f"{s.control_plane_url}/v1/nodes", headers=self._reader()
            )
        except UpstreamError as exc:
            out["nodes"], out["errors"] = None, [*out["errors"], exc.body]
        out["gateways"] = []
        for node, url in gateways.items():
            detail = health[f"gateway {node}"]["detail"]
            gw = {"node": node, "url": url, "ok": health[f"gateway {node}"]["ok"]}
            if isinstance(detail, dict):
                gw.update(
                    router=detail.get("router"),
                    router_reason=detail.get("router_reason"),
                    jobs=detail.get("jobs"),
                    aggregators=detail.get("aggregators"),
                )
            if admin_token is not None and gw["ok"]:
                try:
                    gw["endpoints"] = (await self.router(url, admin_token)).get("endpoints", [])
                except UpstreamError as exc:
                    out["errors"].append(exc.body)
            out["gateways"].append(gw)
        try:
            fns = await self.functions()
        except UpstreamError as exc:
            fns, out["errors"] = [], [*out["errors"], exc.body]
        out["aggregator"] = next((f for f in fns if f["name"] == AGGREGATOR), None)
        out["flstore_functions"] = [f for f in fns if f["name"].startswith(FLSTORE_PREFIX)]
        out["functions"] = fns
        return out

    async def data_plane(self, admin_token: str, rates: dataplane.Rates) -> dict[str, Any]:
        """Each gateway's store, ingest and router endpoints (its admin-only ``/metrics`` and
        ``/v1/router``, with the admin's token), with rates (:mod:`console.dataplane`)."""

        async def node(name: str, url: str) -> tuple[Any, Any, list[Any]]:
            errors: list[Any] = []
            metrics: dict[str, Any] | None = None
            router: dict[str, Any] | None = None
            try:
                r = await self._call(
                    "gateway", "GET", f"{url}/metrics", headers=bearer(admin_token)
                )
                metrics = dataplane.gateway_metrics(r.text)
            except UpstreamError as exc:
                errors.append({**exc.body, "node": name})
            except ValueError as exc:  # not Prometheus text
                bad = UpstreamError(502, "gateway", f"GET {url}/metrics: {exc}")
                errors.append({**bad.body, "node": name})
            try:
                router = await self.router(url, admin_token)
            except UpstreamError as exc:
                errors.append({**exc.body, "node": name})
            return metrics, router, errors

        gateways = self.settings.gateway_map()
        answers = await asyncio.gather(*(node(n, u) for n, u in gateways.items()))
        now = time.monotonic()
        nodes, errors = [], []
        for (name, url), (metrics, router, errs) in zip(gateways.items(), answers, strict=True):
            nodes.append({"url": url, **dataplane.node_view(name, metrics, router, rates, now)})
            errors.extend(errs)
        rates.sweep()
        out = {
            "nodes": nodes,
            "errors": errors,
            "window_s": rates.window_s,
            "rates_from": "console",
        }
        if self.settings.prometheus_url:
            try:
                scraped = await self.prometheus_rates()
            except UpstreamError as exc:  # the console's own rates stay
                errors.append(exc.body)
            else:
                for n in nodes:
                    if n["metrics"] is not None:
                        mine = scraped.get(urlsplit(n["url"]).netloc, {})
                        n["metrics"].update({r: mine.get(r) for r, _ in dataplane.NODE_RATES})
                out.update(rates_from="prometheus", window_s=PROMETHEUS_WINDOW_S)
        return out

    async def prometheus_rates(self) -> dict[str, dict[str, float]]:
        """Per scraped ``host:port`` (Prometheus' ``instance``), the rate of each counter of
        :data:`console.dataplane.NODE_RATES` over :data:`PROMETHEUS_WINDOW_S`."""
        out: dict[str, dict[str, float]] = {}
        for rate, counter in dataplane.NODE_RATES:
            promql = f"rate(fedfaas_gateway_{counter}_total[{PROMETHEUS_WINDOW_S}s])"
            doc = await self._json(
                "prometheus",
                "GET",
                f"{self.settings.prometheus_url}/api/v1/query",
                params={"query": promql},
            )
            try:
                for row in doc["data"]["result"]:
                    out.setdefault(row["metric"]["instance"], {})[rate] = float(row["value"][1])
            except (KeyError, TypeError, ValueError) as exc:
                raise UpstreamError(502, "prometheus", f"{promql}: {exc!r}") from exc
        return out

    # --- jobs -------------------------------------------------------------------------------

    async def job_names(self) -> list[str]:
        """Every job the control plane knows (its ``/metrics`` names each one, analyst scope)."""
        r = await self._call(
            "control-plane",
            "GET",
            f"{self.settings.control_plane_url}/metrics",
            headers=self._reader(),
        )
        names: set[str] = set()
        for family in text_string_to_metric_families(r.text):
            if family.name == JOBS_METRIC.removesuffix("_total"):
                names.update(s.labels["job"] for s in family.samples if "job" in s.labels)
        return sorted(names)

    async def job(self, name: str) -> dict[str, Any]:
        """The control plane's view of job ``name`` (``GET /v1/jobs/{job}``)."""
        out: dict[str, Any] = await self._json(
            "control-plane",
            "GET",
            f"{self.settings.control_plane_url}/v1/jobs/{name}",
            headers=self._reader(),
        )
        return out

    async def jobs(self) -> list[dict[str, Any]]:
        """A summary of each job: rounds done of all, state, the open round."""
        views = await asyncio.gather(*(self.job(n) for n in await self.job_names()))
        return [
            {
                "job": v["job"],
                "rounds": v["rounds"],
                "completed": v["completed"],
                "done": v["done"],
                "failed": v["failed"],
                "enrolled": v["enrolled"],
                "round": (v.get("round") or {}).get("number"),
                "round_state": (v.get("round") or {}).get("state"),
            }
            for v in views
        ]

    async def stop_job(self, name: str, admin_token: str) -> None:
        """Stop and forget job ``name`` (the control plane's ``DELETE /v1/jobs/{job}``), with
        the admin's own token: the control plane checks the admin, not the console."""
        await self._call(
            "control-plane",
            "DELETE",
            f"{self.settings.control_plane_url}/v1/jobs/{name}",
            headers=bearer(admin_token),
        )

    async def revoke_client(
        self, job: str, client: str, force: bool, admin_token: str
    ) -> dict[str, Any]:
        """Revoke ``client`` of ``job`` (the control plane's ``DELETE
        /v1/jobs/{job}/clients/{id}``, which tells every gateway of the job), with the admin's
        own token; its answer (the job's revoked clients, the gateways told)."""
        out: dict[str, Any] = await self._json(
            "control-plane",
            "DELETE",
            f"{self.settings.control_plane_url}/v1/jobs/{job}/clients/{client}",
            params={"force": "true"} if force else None,
            headers=bearer(admin_token),
        )
        return out

    # --- FLStore ----------------------------------------------------------------------------

    async def query(self, body: dict[str, Any]) -> dict[str, Any]:
        """Ask the tracker ``body`` and wait for the answer (its result, cost and function)."""
        out: dict[str, Any] = await self._json(
            "request-tracker",
            "POST",
            f"{self.settings.tracker_url}/v1/queries",
            params={"wait": "true"},
            json=body,
            headers=self._reader(),
            timeout=300.0,
        )
        return out
