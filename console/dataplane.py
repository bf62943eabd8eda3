"""What the data-plane page shows, from each node gateway's ``/metrics`` and ``/v1/router``.

Pure functions and one small state (:class:`Rates`), no I/O (:mod:`console.upstream` reads):

* :func:`gateway_metrics`: a gateway's Prometheus text as the page's numbers: its store's
  objects and bytes (per job and in all), the update bodies it took in, the updates it accepted
  and refused (by code), the request-body bytes it holds now;
* :func:`node_view`: one node's row: those numbers, its router (mode, why, the refused frames
  by reason) and each router endpoint with its counters (the eBPF map's, or the userspace
  router's), with the ingest and per-endpoint rates from :class:`Rates`.

Rates are the console's own: each poll's counters are kept for :data:`WINDOW_S` seconds, and a
rate is the growth from the oldest kept sample to the newest over the time between them (None
until two samples are :data:`MIN_SPAN_S` apart, and again after a counter went down: a
restarted gateway or a re-registered endpoint starts from zero).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: seconds of samples a rate is taken over, at most
WINDOW_S = 10.0
#: seconds two samples must be apart for a rate
MIN_SPAN_S = 0.5
#: the node counters the page shows a rate of: (rate name, counter name)
NODE_RATES = (
    ("ingest_bytes_per_s", "ingest_bytes"),
    ("updates_per_s", "updates_accepted"),
)
#: the endpoint counters the page shows a rate of
ENDPOINT_RATES = (
    ("bytes_received_per_s", "bytes_received"),
    ("msgs_received_per_s", "msgs_received"),
)


def gateway_metrics(text: str) -> dict[str, Any]:
    """The page's numbers from one gateway's ``/metrics`` text (a metric it does not have
    reads 0: a gateway with no job yet has no store series)."""
    store: dict[str, dict[str, float]] = {}
    scalars = {
        "fedfaas_gateway_ingest_bytes_total": "ingest_bytes",
        "fedfaas_gateway_updates_accepted_total": "updates_accepted",
        "fedfaas_gateway_rounds_published_total": "rounds_published",
        "fedfaas_gateway_body_bytes_held": "body_bytes_held",
        "fedfaas_gateway_ingest_seconds_count": "ingest_count",
        "fedfaas_gateway_ingest_seconds_sum": "ingest_seconds",
    }
    out: dict[str, Any] = dict.fromkeys(scalars.values(), 0.0)
    rejected: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in scalars:
                out[scalars[s.name]] = float(s.value)
            elif s.name == "fedfaas_gateway_updates_rejected_total":
                rejected[s.labels.get("code", "")] = float(s.value)
            elif s.name in ("fedfaas_gateway_store_objects", "fedfaas_gateway_store_bytes"):
                key = "objects" if s.name.endswith("objects") else "bytes"
                store.setdefault(s.labels.get("job", ""), {"objects": 0.0, "bytes": 0.0})[key] = (
                    float(s.value)
                )
    out["updates_rejected"] = rejected
    out["store"] = store
    out["store_objects"] = sum(v["objects"] for v in store.values())
    out["store_bytes"] = sum(v["bytes"] for v in store.values())
    count = out["ingest_count"]
    out["mean_ingest_s"] = out["ingest_seconds"] / count if count else None
    return out


@dataclass
class Rates:
    """Recent samples of counters, by key (a node, an endpoint), for per-second rates."""

    window_s: float = WINDOW_S
    samples: dict[str, deque[tuple[float, dict[str, float]]]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def rates(
        self, key: str, now: float, counters: dict[str, float], names: tuple[tuple[str, str], ...]
    ) -> dict[str, float | None]:
        """Record ``counters`` of ``key`` at ``now``; the rate of each ``(rate, counter)`` of
        ``names`` over the kept samples (None without two far enough apart)."""
        self.seen.add(key)
        kept = self.samples.setdefault(key, deque())
        if kept and any(counters.get(c, 0.0) < kept[-1][1].get(c, 0.0) for _, c in names):
            kept.clear()  # a counter went down: the gateway or the endpoint started again
        kept.append((now, counters))
        while len(kept) > 2 and now - kept[1][0] >= self.window_s:
            kept.popleft()
        first_at, first = kept[0]
        span = now - first_at
        if span < MIN_SPAN_S:
            return dict.fromkeys((r for r, _ in names), None)
        return {r: (counters.get(c, 0.0) - first.get(c, 0.0)) / span for r, c in names}

    def sweep(self) -> None:
        """After a whole poll: drop the samples of keys it did not see (endpoints gone)."""
        for key in [k for k in self.samples if k not in self.seen]:
            del self.samples[key]
        self.seen.clear()


def node_view(
    node: str,
    metrics: dict[str, Any] | None,
    router: dict[str, Any] | None,
    rates: Rates,
    now: float,
) -> dict[str, Any]:
    """One node's data plane: ``metrics`` (:func:`gateway_metrics`) and ``router`` (the
    gateway's ``/v1/router``), either None when the gateway did not give it, with rates."""
    out: dict[str, Any] = {"node": node, "metrics": metrics, "router": None, "endpoints": []}
    if metrics is not None:
        counters = {c: float(metrics[c]) for _, c in NODE_RATES}
        out["metrics"] = {**metrics, **rates.rates(node, now, counters, NODE_RATES)}
    if router is None:
        return out
    out["router"] = {"mode": router.get("mode"), "reason": router.get("reason")}
    out["drops"] = router.get("drops") or {}
    for ep in router.get("endpoints") or []:
        m = ep.get("metrics") or {}
        key = f"{node}/{ep.get('id')}/{ep.get('registered_ns')}"
        counters = {c: float(m.get(c) or 0) for _, c in ENDPOINT_RATES}
        tasks = int(m.get("tasks_completed") or 0)
        out["endpoints"].append(
            {
                "id": ep.get("id"),
                "job": ep.get("job"),
                "role": ep.get("role"),
                "pid": ep.get("pid"),
                "local": ep.get("local"),
                "msgs_received": m.get("msgs_received"),
                "msgs_sent": m.get("msgs_sent"),
                "bytes_received": m.get("bytes_received"),
                "bytes_sent": m.get("bytes_sent"),
                "tasks_completed": tasks,
                "mean_exec_ms": int(m.get("exec_ns_total") or 0) / tasks / 1e6 if tasks else None,
                "drops": m.get("drops"),
                "task_open": m.get("task_open"),
                **rates.rates(key, now, counters, ENDPOINT_RATES),
            }
        )
    return out
