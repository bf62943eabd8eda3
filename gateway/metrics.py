"""Prometheus metrics of one gateway (own registry, so several gateways fit in one process)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    import bpf
    from gateway.bodies import MemoryBudget
    from gateway.jobs import Job


class _StoreCollector:
    def __init__(
        self,
        jobs: Mapping[str, Job],
        budget: MemoryBudget,
        router: Callable[[], bpf.RouterServer | None],
    ) -> None:
        self.jobs, self.budget, self.router = jobs, budget, router

    def collect(self) -> Any:
        objs = GaugeMetricFamily(
            "fedfaas_gateway_store_objects", "live store objects", labels=["job"]
        )
        byts = GaugeMetricFamily(
            "fedfaas_gateway_store_bytes", "store bytes incl. pool", labels=["job"]
        )
        ver = GaugeMetricFamily(
            "fedfaas_gateway_model_version", "global model version", labels=["job"]
        )
        eps = GaugeMetricFamily(
            "fedfaas_gateway_endpoints", "registered router endpoints", labels=["mode"]
        )
        for job in list(self.jobs.values()):
            st = job.ns.stats()
            objs.add_metric([job.name], st["objects"])
            byts.add_metric([job.name], st["bytes"])
            ver.add_metric([job.name], job.version)
        router = self.router()
        if router is not None:
            with contextlib.suppress(Exception):  # router not started yet
                eps.add_metric([router.mode], len(router.endpoints()))
        budget = self.budget
        held = GaugeMetricFamily(
            "fedfaas_gateway_body_bytes_held",
            "request-body bytes held now, against max_inflight_bytes",
            value=budget.used,
        )
        refused = CounterMetricFamily(
            "fedfaas_gateway_body_budget_refusals",
            "requests answered 503 because the node's body budget was spent",
            value=budget.refused,
        )
        yield from (objs, byts, ver, eps, held, refused)


class Metrics:
    def __init__(
        self,
        node: str,
        jobs: Mapping[str, Job],
        budget: MemoryBudget,
        router: Callable[[], bpf.RouterServer | None],
    ) -> None:
        """The metrics of node ``node``; the store gauges read ``jobs``, ``budget`` and the
        router (None until the gateway starts it) at scrape time."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.updates = Counter(
            "fedfaas_gateway_updates_accepted", "updates sealed and journaled", registry=r
        )
        self.rejected = Counter(
            "fedfaas_gateway_updates_rejected", "updates refused", ["code"], registry=r
        )
        self.ingest_bytes = Counter(
            "fedfaas_gateway_ingest_bytes", "update body bytes received", registry=r
        )
        self.ingest_seconds = Histogram(
            "fedfaas_gateway_ingest_seconds",
            "upload time per update",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.rounds = Counter(
            "fedfaas_gateway_rounds_published", "global models published", registry=r
        )
        self.redeliveries = Counter(
            "fedfaas_gateway_redeliveries", "slots re-run after an endpoint died", registry=r
        )
        self.grants = Counter(
            "fedfaas_gateway_endpoint_grants",
            "aggregator endpoints granted a job (each precedes a TASK on a new job)",
            registry=r,
        )
        self.reuses = Counter(
            "fedfaas_gateway_endpoint_reuses",
            "grants that moved a warm endpoint from one job to another (no restart)",
            registry=r,
        )
        self.journal_retries = Counter(
            "fedfaas_gateway_journal_retries",
            "journal operations Redis refused or did not answer, tried again (by operation)",
            ["op"],
            registry=r,
        )
        self.task_failures = Counter(
            "fedfaas_gateway_task_failures",
            "background tasks that ended by an exception (by task kind; each one logged)",
            ["task"],
            registry=r,
        )
        self.partial_retries = Counter(
            "fedfaas_gateway_partial_retries",
            "forwards of a partial to the job's root node tried again (no answer, 5xx, or the "
            "root not caught up with the round)",
            registry=r,
        )
        self.store_refusals = Counter(
            "fedfaas_gateway_accumulators_refused",
            "accumulators the store refused a slot (its memory file system full): the slot "
            "waited without an endpoint and was started again once the store had room",
            registry=r,
        )
        self.dropped_updates = Counter(
            "fedfaas_gateway_updates_dropped",
            "acknowledged updates of this node that no published model holds (by reason; each "
            "logged and listed in the job's status)",
            ["reason"],
            registry=r,
        )
        self.aggregator_failures = Counter(
            "fedfaas_gateway_aggregator_failures",
            "FAILED frames from aggregator endpoints: a slot's or shard's work not done for "
            "want of an object (missing, unreadable, another model); each logged at ERROR and "
            "the slot run again once silent for the stall limit",
            registry=r,
        )
        r.register(_StoreCollector(jobs, budget, router))

    def render(self) -> bytes:
        return generate_latest(self.registry)
