"""FedFaaS sidecar: 64-byte frames routed between endpoints by eBPF (SK_MSG) or in userspace.

Gateway side::

    router = bpf.RouterServer("/run/fedfaas/router.sock").start()
    gw = router.local_endpoint(job=1)

Function side::

    ep = bpf.connect("/run/fedfaas/router.sock")      # registers in no job
    router.grant(ep.id, 1, store_dir)                 # gateway side: the job is granted
    ep.recv()                                         # the GRANT: ep.job == 1, ep.store_fd
    ep.send(bpf.Frame(dst=gw_id, src=0, kind=bpf.Kind.PARTIAL, job=1, key=key))
"""

from bpf.endpoint import Endpoint, connect
from bpf.errors import EbpfUnavailable, EndpointClosed, FrameError, RegistrationRefused, RouterError
from bpf.frame import FLAG_LAZY, FLAG_MASKED, FRAME_SIZE, KEY_SIZE, Failure, Frame, Kind, Role
from bpf.metrics import DropReason, EndpointInfo, EndpointMetrics
from bpf.probe import probe
from bpf.prometheus import prometheus_collector
from bpf.router import RouterServer

__all__ = [
    "FLAG_LAZY",
    "FLAG_MASKED",
    "FRAME_SIZE",
    "KEY_SIZE",
    "DropReason",
    "EbpfUnavailable",
    "Endpoint",
    "EndpointClosed",
    "EndpointInfo",
    "EndpointMetrics",
    "Failure",
    "Frame",
    "FrameError",
    "Kind",
    "RegistrationRefused",
    "Role",
    "RouterError",
    "RouterServer",
    "connect",
    "probe",
    "prometheus_collector",
]
