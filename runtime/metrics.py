"""Prometheus metrics under the OpenFaaS gateway's names, so OpenFaaS's dashboards and alert
rules read the runtime unchanged.

* ``gateway_function_invocation_total{function_name, code}``: invocations through
  ``/function/*``, by the answer's status;
* ``gateway_functions_seconds{function_name, code}``: their duration (histogram), from the
  request to the last byte of the answer;
* ``gateway_service_count{function_name}``: ready replicas of each function.

``function_name`` is ``<name>.<namespace>``, as the gateway labels it. Served on ``GET /metrics``
with the basic auth of ``/system/*`` (Prometheus: ``basic_auth`` with ``password_file``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from runtime.provider import Provider

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    """The runtime's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.invocations = Counter(
            "gateway_function_invocation",
            "Function invocations",
            ["function_name", "code"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "gateway_functions_seconds",
            "Function time taken",
            ["function_name", "code"],
            registry=self.registry,
        )
        self.replicas = Gauge(
            "gateway_service_count",
            "Current count of replicas for function",
            ["function_name"],
            registry=self.registry,
        )

    def observe(self, function: str, code: int, seconds: float) -> None:
        """One invocation of ``function`` (``name.namespace``) answered ``code``."""
        self.invocations.labels(function, str(code)).inc()
        self.seconds.labels(function, str(code)).observe(seconds)

    def render(self, provider: Provider) -> bytes:
        """The text exposition, with each function's replica count read now."""
        self.replicas.clear()
        for fn in provider.list_status():
            label = f"{fn['name']}.{provider.namespace}"
            self.replicas.labels(label).set(int(fn.get("availableReplicas") or 0))
        return generate_latest(self.registry)
