"""Per-endpoint metrics: the dataclasses, the kernel map layout, and the accounting rules.

Pure module (no sockets, no bcc): the eBPF program and the userspace router follow the same
rules, written here once for the userspace side and mirrored in ``sidecar.c``:

- a delivered frame counts as sent by ``src`` and received by ``dst`` (messages and bytes),
  with the send/receive time;
- an UPDATE received by an endpoint with no task open opens one (``first_update_recv_ns``);
- a PARTIAL or RESULT sent by an endpoint with a task open closes it: E = now - open time
  (LIFL's execution time, appendix E), kept as the last E, a running sum and a count;
- a refused frame counts as a drop of its sender (when known) and of its reason.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from bpf.frame import Kind

_EP_FIELDS = (
    "tx_msgs",
    "tx_bytes",
    "rx_msgs",
    "rx_bytes",
    "last_tx_ns",
    "last_rx_ns",
    "first_update_rx_ns",
    "open_since_ns",
    "result_tx_ns",
    "exec_last_ns",
    "exec_total_ns",
    "tasks",
    "drops",
)
#: Layout of ``struct ep_metrics`` in sidecar.c: 13 native u64.
EP_METRICS = struct.Struct("=" + "Q" * len(_EP_FIELDS))


class DropReason(enum.IntEnum):
    """Why a frame was refused; the index of the kernel's ``drops`` array."""

    BAD_SIZE = 0
    UNKNOWN_SENDER = 1
    SPOOFED_SRC = 2
    UNKNOWN_DST = 3
    CROSS_JOB = 4
    UNDELIVERABLE = 5


N_DROP_REASONS = len(DropReason)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """One registered endpoint.

    Attributes
    ----------
    id : int
        The u32 endpoint id assigned by the router.
    job : int
        Numeric job id; frames are delivered only between endpoints of the same job.
    role : str
        Free-form role given at registration ("aggregator", "gateway", ...).
    pid, uid : int
        The peer process (SO_PEERCRED) at registration.
    local : bool
        True for the gateway's own endpoints (:meth:`RouterServer.local_endpoint`).
    registered_ns : int
        CLOCK_MONOTONIC time of registration.
    """

    id: int
    job: int
    role: str
    pid: int
    uid: int
    local: bool
    registered_ns: int


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """Counters of one endpoint; times are CLOCK_MONOTONIC ns (bpf_ktime_get_ns), 0 = never.

    ``exec_ns`` is E, from the first UPDATE received to the PARTIAL/RESULT sent, of the last
    completed task (None before the first one completes).
    """

    endpoint_id: int
    msgs_sent: int = 0
    bytes_sent: int = 0
    msgs_received: int = 0
    bytes_received: int = 0
    last_send_ns: int = 0
    last_recv_ns: int = 0
    first_update_recv_ns: int = 0
    result_sent_ns: int = 0
    exec_ns: int | None = None
    exec_ns_total: int = 0
    tasks_completed: int = 0
    drops: int = 0
    task_open: bool = False

    @property
    def mean_exec_ns(self) -> float | None:
        """Mean E over completed tasks, or None."""
        return self.exec_ns_total / self.tasks_completed if self.tasks_completed else None


def decode_ep_metrics(endpoint_id: int, raw: bytes | bytearray | memoryview) -> EndpointMetrics:
    """Decode one value of the kernel's ``metrics`` map (``struct ep_metrics``)."""
    v = dict(zip(_EP_FIELDS, EP_METRICS.unpack(bytes(raw)), strict=True))
    return EndpointMetrics(
        endpoint_id=endpoint_id,
        msgs_sent=v["tx_msgs"],
        bytes_sent=v["tx_bytes"],
        msgs_received=v["rx_msgs"],
        bytes_received=v["rx_bytes"],
        last_send_ns=v["last_tx_ns"],
        last_recv_ns=v["last_rx_ns"],
        first_update_recv_ns=v["first_update_rx_ns"],
        result_sent_ns=v["result_tx_ns"],
        exec_ns=v["exec_last_ns"] if v["tasks"] else None,
        exec_ns_total=v["exec_total_ns"],
        tasks_completed=v["tasks"],
        drops=v["drops"],
        task_open=v["open_since_ns"] != 0,
    )


def decode_drops(values: list[int]) -> dict[str, int]:
    """Name the kernel's drop counters: ``{"cross_job": 3, ...}`` for every reason."""
    out = {r.name.lower(): 0 for r in DropReason}
    for reason in DropReason:
        if reason < len(values):
            out[reason.name.lower()] = int(values[reason])
    return out


@dataclass(slots=True)
class _Counters:
    tx_msgs: int = 0
    tx_bytes: int = 0
    rx_msgs: int = 0
    rx_bytes: int = 0
    last_tx_ns: int = 0
    last_rx_ns: int = 0
    first_update_rx_ns: int = 0
    open_since_ns: int = 0
    result_tx_ns: int = 0
    exec_last_ns: int = 0
    exec_total_ns: int = 0
    tasks: int = 0
    drops: int = 0

    def raw(self) -> bytes:
        return EP_METRICS.pack(*(getattr(self, f) for f in _EP_FIELDS))


@dataclass(slots=True)
class Accounting:
    """The userspace router's counters, with exactly the kernel program's rules."""

    endpoints: dict[int, _Counters] = field(default_factory=dict)
    drop_counts: list[int] = field(default_factory=lambda: [0] * N_DROP_REASONS)

    def add(self, endpoint_id: int) -> None:
        self.endpoints[endpoint_id] = _Counters()

    def remove(self, endpoint_id: int) -> None:
        self.endpoints.pop(endpoint_id, None)

    def delivered(self, src: int, dst: int, kind: int, nbytes: int, now: int) -> None:
        s = self.endpoints.get(src)
        d = self.endpoints.get(dst)
        if s is not None:
            s.tx_msgs += 1
            s.tx_bytes += nbytes
            s.last_tx_ns = now
            if (kind == Kind.PARTIAL or kind == Kind.RESULT) and s.open_since_ns:
                s.result_tx_ns = now
                s.exec_last_ns = now - s.open_since_ns
                s.exec_total_ns += s.exec_last_ns
                s.tasks += 1
                s.open_since_ns = 0
        if d is not None:
            d.rx_msgs += 1
            d.rx_bytes += nbytes
            d.last_rx_ns = now
            if kind == Kind.UPDATE and not d.open_since_ns:
                d.open_since_ns = now
                d.first_update_rx_ns = now

    def dropped(self, src: int | None, reason: DropReason) -> None:
        self.drop_counts[reason] += 1
        if src is not None and (s := self.endpoints.get(src)) is not None:
            s.drops += 1

    def snapshot(self) -> dict[int, EndpointMetrics]:
        return {i: decode_ep_metrics(i, c.raw()) for i, c in self.endpoints.items()}

    def drops(self) -> dict[str, int]:
        return decode_drops(self.drop_counts)
