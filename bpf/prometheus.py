"""Export the router's metrics to Prometheus: read at scrape time, never per message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bpf.router import RouterServer

_NS = 1e-9


class RouterCollector:
    """A ``prometheus_client`` collector over one :class:`RouterServer`.

    Register it with ``prometheus_client.REGISTRY.register(bpf.prometheus_collector(router))``
    (or a private ``CollectorRegistry``); each scrape reads the kernel maps (eBPF mode) or the
    router's counters (userspace mode) once.
    """

    def __init__(self, router: RouterServer, prefix: str = "fedfaas_router") -> None:
        self.router = router
        self.prefix = prefix

    def describe(self) -> list[Any]:
        return []  # collected lazily: the endpoints change between scrapes

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p, router = self.prefix, self.router
        info = GaugeMetricFamily(
            f"{p}_mode", "Active router backend (1) and why", labels=["mode", "reason"]
        )
        info.add_metric([router.mode, router.reason], 1)
        yield info
        endpoints = router.endpoints()
        yield GaugeMetricFamily(f"{p}_endpoints", "Registered endpoints", value=len(endpoints))
        labels = ["endpoint", "job", "role"]
        fams = {
            "msgs_sent": CounterMetricFamily(f"{p}_messages_sent", "Frames sent", labels=labels),
            "msgs_received": CounterMetricFamily(
                f"{p}_messages_received", "Frames received", labels=labels
            ),
            "bytes_sent": CounterMetricFamily(f"{p}_sent_bytes", "Bytes sent", labels=labels),
            "bytes_received": CounterMetricFamily(
                f"{p}_received_bytes", "Bytes received", labels=labels
            ),
            "drops": CounterMetricFamily(f"{p}_endpoint_drops", "Frames refused", labels=labels),
            "tasks_completed": CounterMetricFamily(
                f"{p}_tasks",
                "Tasks completed (first UPDATE in to PARTIAL/RESULT out)",
                labels=labels,
            ),
        }
        exec_last = GaugeMetricFamily(
            f"{p}_exec_seconds", "E of the last completed task (kernel clock)", labels=labels
        )
        exec_sum = CounterMetricFamily(
            f"{p}_exec_seconds_sum", "Sum of E over completed tasks", labels=labels
        )
        for endpoint_id, m in sorted(router.metrics().items()):
            ep = endpoints.get(endpoint_id)
            lv = [str(endpoint_id), str(ep.job) if ep else "", ep.role if ep else ""]
            for attr, fam in fams.items():
                fam.add_metric(lv, getattr(m, attr))
            if m.exec_ns is not None:
                exec_last.add_metric(lv, m.exec_ns * _NS)
            exec_sum.add_metric(lv, m.exec_ns_total * _NS)
        yield from fams.values()
        yield exec_last
        yield exec_sum
        drops = CounterMetricFamily(f"{p}_drops", "Frames refused by reason", labels=["reason"])
        for reason, count in router.drops().items():
            drops.add_metric([reason], count)
        yield drops


def prometheus_collector(router: RouterServer, prefix: str = "fedfaas_router") -> RouterCollector:
    """A Prometheus collector for ``router`` (see :class:`RouterCollector`)."""
    return RouterCollector(router, prefix)
