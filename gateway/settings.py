"""Settings of one node gateway (env prefix ``FEDFAAS_GATEWAY_``; the command line wins)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from cache_engine.node_memory import NODE_MEMORY_VAR
from core.cmdline import CommandLineSettings
from core.discovery import parse_service
from core.objstore import DEFAULT_ROOT
from core.tls import TlsSettings
from core.wire import DEFAULT_MAX_HEADER


class GatewaySettings(CommandLineSettings, TlsSettings):
    """One node gateway.

    Attributes
    ----------
    node : name of this node (store namespace ``<shm_root>/<node>/<job>``).
    host, port : where the HTTP API listens (loopback by default).
    state_dir : secrets and the registration socket live here.
    redis_url : the journal.
    redis_credentials_file : the gateway's Redis user (a 0600 credentials file, see
        :mod:`core.secretfiles`); required.
    shm_root : object-store root. A stop (SIGTERM, a crash) leaves every job's store in it: a
        restart resumes each job from the journal and the objects it names (the model, the
        open round's acknowledged updates); a job's store is removed with the job. Whoever
        made the root removes it with the deployment (``fedfaas down`` does).
    router_socket : registration socket of the embedded router (default
        ``<state_dir>/router-<node>.sock``); ``FEDFAAS_GATEWAY_ROUTER_SOCKET``, the same setting
        the ``aggregator`` function's replicas read to find this node's router.
    prefer_ebpf : load the eBPF sidecar when possible (else the userspace router).
    admin_secret_file : admin secret (generated on first start when missing).
    fanout : updates per leaf aggregator in the static plan (I).
    lazy : aggregate lazily (when the goal is reached) instead of eagerly.
    max_header : bound on the safetensors JSON header of an upload.
    max_job_body : bound on the initial-weights body of ``POST /v1/jobs`` (streamed into shared
        memory as it arrives, never buffered whole on the heap).
    max_json_body : bound on the body of every other control route (JSON): a larger
        ``Content-Length`` is answered 413 before a byte of it is read.
    pool : store buffers pre-faulted when a job is created (``None``: max_inflight + 2); freed
        buffers are kept for reuse up to an estimate of the round's peak, within ``pool_max_bytes``.
    check_finite : reject updates holding NaN or Inf.
    read_timeout : seconds without a byte before a half-received request is dropped (its
        buffer freed); idle keep-alive connections get four times as long.
    max_inflight : uploads of one job received at once (others wait, reading paused: TCP
        back-pressure keeps their bodies out of memory); 0 = no limit.
    max_inflight_bytes : this node's memory budget, in bytes, for request bodies in flight, all
        jobs together: an upload holds its store object, a cross-node partial its object, a
        JSON body its bytes, the job-creation body what has arrived of it, from before the first
        byte is received until the request ends. A request that would go past it is answered
        503 with ``Retry-After`` (and a JSON body) and nothing is allocated; 0 = no limit.
        No body is read at all before its request is authenticated and routed.
    node_memory_bytes : the node's memory budget (:mod:`cache_engine.node_memory`), the one
        setting the node's cache engine reads too (``FEDFAAS_NODE_MEMORY_BYTES``, or
        ``FEDFAAS_GATEWAY_NODE_MEMORY_BYTES`` for the gateway alone); ``None``: half the node's
        memory (its cgroup limit where lower). An upload or a cross-node partial that needs a
        new store buffer while the stores under ``shm_root`` would pass it is answered 503
        ``store_full`` with ``Retry-After``, nothing kept (the SDK sends it again); one that
        lands in a buffer kept for reuse takes no new memory and is not refused. The round's
        own objects (accumulators, the global) are not refused: the round frees its updates.
        The root keeps a round's updates for the handoff only while the stores hold under half
        the budget (:mod:`gateway.flstore`). The cache engine counts the same store against the
        same budget and gives back what FLStore holds when the store grows into it.
    peers : other node gateways by node name (``{"b": "http://127.0.0.1:8082"}``); these
        entries win over discovered ones.
    peers_service : ``HOST:PORT`` of a DNS name that resolves to every node gateway (the
        chart's headless Service ``<release>-node-gateway-peers``); when set, the gateway asks
        each address's ``/healthz`` for its node and keeps the peer map (this node left out)
        up to date every ``discovery_interval`` seconds (:mod:`core.discovery`). Partials
        go to the job's root node, and the model comes from it, at the URL found last.
    discovery_interval : seconds between two refreshes of the discovered peer map.
    stall_s : seconds a running eager slot that holds every input it needs may go without a
        frame from its endpoint before it runs again there from what the gateway holds (a lost
        64-byte frame costs this, not the round); 0 = never.
    planner : ``"module:function"`` replacing :func:`gateway.plan.static_plan`; called as
        ``planner(goal, clients, nodes)`` and returning a :class:`gateway.plan.Plan`.
    minio_endpoint, minio_bucket : async checkpoints (optional).
    minio_credentials_file : the gateway's MinIO user (a 0600 credentials file); required with
        ``minio_endpoint``.
    checkpoint_clients : also checkpoint every accepted client update (FLStore reads them).
    engine_url : the FLStore cache engine, told when each round is in MinIO (optional).
    engine_token_file : the engine's service token (a 0600 file), sent with that notice.
    handoff_ttl_s : with an engine, the root keeps each round's accepted updates in the store
        after aggregation and offers them to the cache functions of this node with that
        notice (:mod:`core.objstore.handoff`, socket ``<shm_root>/<node>/handoff.sock``):
        they map the updates in place instead of reading them back from MinIO. An offer no
        cache function claims within this many seconds, or by the job's next round, is
        dropped. While the round runs, its updates stay in the store (the cache would hold the
        round anyway; here it is the same pages). 0 = no handoff: MinIO only, and the store's
        memory stays bounded by the aggregation's working set (the chart sets 0: faas-netes
        gives cache functions no way to this node's store).
    stop_grace : seconds a SIGTERM (or SIGINT) leaves the gateway to stop cleanly; past them, or
        at a second signal, it logs what it abandons (threads and pending tasks) and exits 1.
    encode_threads : threads that encode a round's global model for ``GET model`` (default: the
        node's cores, at most 4): the copy out of the store is split by element range.
    retry_max_s : the longest wait between two tries of a journal write that Redis refused or
        did not answer, or of a partial's forward to the job's root node (the waits double from
        50 ms up to it); neither is ever given up while its round is open here.
    tls_cert_file, tls_key_file : this gateway's TLS certificate and key (0600) files: with them
        the port speaks HTTPS only (:mod:`core.tls`; plain HTTP is answered a 400 saying so),
        and the gateway presents the certificate when it calls its peers (mTLS).
    tls_ca_file : the platform's CA: a client certificate must be one it signed (the handshake
        fails otherwise), and the peers' certificates are verified against it.
    tls_client_certs : ``"optional"`` (clients of the SDK present none; one that presents a
        certificate must present a good one), ``"required"`` (mTLS only) or ``"none"``. With a
        CA and unless ``"none"`` (else the gateway logs a warning at start), the internal
        routes (those only the platform's parts call: partials from peers, the control plane's
        plan, close, adopt, unmask and deletions; :mod:`gateway.callers`) answer 403
        ``client_certificate_required`` to a request whose connection presented no client
        certificate, whatever its bearer token.
    tls_internal_names : comma-separated names of the parts whose client certificates the
        internal routes take (a certificate's common name or a DNS name of its subject
        alternative names, e.g. ``control-plane,gateway-node0,gateway-node1``); empty: any
        certificate the platform's CA signed.
    round_times_kept : rounds whose times (first byte, result, publication) a job keeps for its
        status; older ones are dropped, so a job's memory does not grow with its rounds.
    """

    model_config = SettingsConfigDict(
        env_prefix="FEDFAAS_GATEWAY_", extra="ignore", populate_by_name=True
    )

    MODULE: ClassVar[str] = "gateway"
    DESCRIPTION: ClassVar[str] = "FedFaaS node gateway"
    #: setting -> flag of ``python -m gateway`` (booleans: the flag that turns the default over)
    FLAGS: ClassVar[dict[str, str]] = {
        "node": "--node",
        "host": "--host",
        "port": "--port",
        "state_dir": "--state-dir",
        "redis_url": "--redis",
        "redis_credentials_file": "--redis-credentials-file",
        "shm_root": "--shm-root",
        "router_socket": "--router-socket",
        "prefer_ebpf": "--no-ebpf",
        "admin_secret_file": "--admin-secret-file",
        "fanout": "--fanout",
        "lazy": "--lazy",
        "max_header": "--max-header",
        "max_job_body": "--max-job-body",
        "max_json_body": "--max-json-body",
        "pool": "--pool",
        "pool_max_bytes": "--pool-max-bytes",
        "check_finite": "--no-check-finite",
        "max_inflight": "--max-inflight",
        "max_inflight_bytes": "--max-inflight-bytes",
        "node_memory_bytes": "--node-memory-bytes",
        "read_timeout": "--read-timeout",
        "peers": "--peers",
        "peers_service": "--peers-service",
        "discovery_interval": "--discovery-interval",
        "stall_s": "--stall-s",
        "planner": "--planner",
        "minio_endpoint": "--minio",
        "minio_credentials_file": "--minio-credentials-file",
        "minio_bucket": "--minio-bucket",
        "checkpoint_clients": "--no-checkpoint-clients",
        "engine_url": "--engine",
        "engine_token_file": "--engine-token-file",
        "handoff_ttl_s": "--handoff-ttl-s",
        "stop_grace": "--stop-grace",
        "encode_threads": "--encode-threads",
        "retry_max_s": "--retry-max-s",
        "round_times_kept": "--round-times-kept",
        "tls_cert_file": "--tls-cert-file",
        "tls_key_file": "--tls-key-file",
        "tls_ca_file": "--tls-ca-file",
        "tls_client_certs": "--tls-client-certs",
        "tls_internal_names": "--tls-internal-names",
    }

    node: str = "node0"
    host: str = "127.0.0.1"
    port: int = 8081
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".state" / "gateway")
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_credentials_file: Path | None = None
    shm_root: Path = DEFAULT_ROOT
    router_socket: Path | None = None
    prefer_ebpf: bool = True
    admin_secret_file: Path | None = None
    fanout: int = 2
    lazy: bool = False
    max_header: int = DEFAULT_MAX_HEADER
    max_job_body: int = 1 << 30
    max_json_body: int = 1 << 20
    pool: int | None = None
    pool_max_bytes: int = 2 << 30
    check_finite: bool = True
    max_inflight: int = 4
    max_inflight_bytes: int = 4 << 30
    node_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("FEDFAAS_GATEWAY_NODE_MEMORY_BYTES", NODE_MEMORY_VAR),
    )
    read_timeout: float = 60.0
    peers: dict[str, str] = Field(default_factory=dict)
    peers_service: str | None = None
    discovery_interval: float = Field(default=10.0, gt=0)
    stall_s: float = Field(default=10.0, ge=0)
    planner: str | None = None
    minio_endpoint: str | None = None
    minio_credentials_file: Path | None = None
    minio_bucket: str = "fedfaas"
    checkpoint_clients: bool = True
    engine_url: str | None = None
    engine_token_file: Path | None = None
    handoff_ttl_s: float = Field(default=30.0, ge=0)
    stop_grace: float = 20.0
    encode_threads: int = Field(default_factory=lambda: min(4, os.cpu_count() or 1), ge=1)
    retry_max_s: float = Field(default=5.0, gt=0)
    round_times_kept: int = Field(default=16, ge=1)
    tls_internal_names: str = ""

    @field_validator("peers_service")
    @classmethod
    def _service_address(cls, value: str | None) -> str | None:
        if value:
            parse_service(value)  # ValueError: the flag is named in the error
        return value or None

    def socket_path(self) -> Path:
        return self.router_socket or self.state_dir / f"router-{self.node}.sock"

    def handoff_path(self) -> Path:
        return self.shm_root / self.node / "handoff.sock"

    def secret_path(self) -> Path:
        return self.admin_secret_file or self.state_dir / "admin-secret"
