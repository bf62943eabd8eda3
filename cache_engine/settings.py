"""Settings of the cache engine service (env prefix ``FEDFAAS_ENGINE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from cache_engine.node_memory import NODE_MEMORY_VAR
from core.cmdline import CommandLineSettings
from core.tls import TlsSettings

_REPO = Path(__file__).resolve().parent.parent


class EngineSettings(CommandLineSettings, TlsSettings):
    """Where the engine's state lives and how it sizes the cache.

    Attributes
    ----------
    redis_url, minio_endpoint, bucket
        Backing services (Redis holds the location table and catalog; MinIO the cold copy).
    redis_credentials_file, minio_credentials_file
        The engine's Redis and MinIO users (0600 credentials files, see
        :mod:`core.secretfiles`); both required. The MinIO user reads the checkpoints and
        mints per-job temporary credentials for the cache functions, which have none of their
        own.
    runtime_url, runtime_auth_dir
        The OpenFaaS gateway (embedded runtime) that creates the cache functions, and the folder
        of its basic-auth files (``basic-auth-user``, ``basic-auth-password``): a folder without
        them stops the engine at start; none only for a gateway with basic auth off.
    policy
        ``flstore`` (P1-P4) or a baseline: ``lru``, ``fifo``, ``lfu``, ``random``, ``static``.
    capacity_objects
        Objects the policy keeps resident in total.
    function_capacity_bytes
        Memory one cache function may hold; more functions are created beyond it.
    secondaries
        ``k``: copies of every object beyond the primary.
    max_functions
        Upper bound on cache functions.
    node_memory_bytes
        The node's memory budget (:mod:`cache_engine.node_memory`), the one setting the node
        gateway reads too (``FEDFAAS_NODE_MEMORY_BYTES``, or ``FEDFAAS_ENGINE_NODE_MEMORY_BYTES``
        for the engine alone); ``None``: half the node's memory (its cgroup limit where lower).
        It covers the store (``store_root``), the cache functions' private memory, the store
        objects kept for them and loads under way (:mod:`cache_engine.budget`); past it nothing
        more is loaded: queries read their models from MinIO.
    store_root
        The node gateways' store root (their ``shm_root``), whose bytes count against the
        budget (:func:`cache_engine.node_memory.store_bytes`); ``None``: the store is out of
        reach (another machine, a Kubernetes pod), and only what FLStore keeps in it counts.
    query_memory_bytes
        Of the budget, what loads never take: the queries' working memory (a reducer's
        batch of sub-models and their parts' answers, chunks streamed from MinIO: about
        1 GiB with ResNet-18-sized models); default 1 GiB.
    function_image
        Image of the cache functions: ``flstore`` in ``stack.platform.yml``, which ``make images``
        builds under this name (the chart sets it from ``cacheEngine.functionImage``).
    ping_interval
        Seconds between liveness pings of each function.
    evict_grace
        Seconds between a policy eviction and freeing the memory (in-flight queries finish).
    call_timeout, run_timeout
        Seconds the engine waits for a cache function's load; the longest a query may run in
        one (its watchdog's ``exec_timeout``: a contribution query over a large round takes
        minutes).
    ping_timeout, dead_after
        A ping that times out counts as one failure; ``dead_after`` in a row mark the function
        dead (a refused connection or a gateway 5xx marks it dead at once).
    admin_token_file, service_token_file
        Secret files (0600) of the admin scope (required) and of the service scope (the
        tracker and the gateways); every route but ``/healthz`` needs one of them.
    function_token_file
        Secret file (0600) of the function token (the runtime secret ``fedfaas-function-token``),
        sent to the cache functions as ``Authorization: Bearer``; required.
    stop_grace
        Seconds a SIGTERM leaves the service to stop (:func:`core.shutdown.serve`): in-flight
        requests get half, then are cancelled; a second signal or the end exits 1 at once.
    tls_cert_file, tls_key_file, tls_ca_file, tls_client_certs
        TLS for the service's port (:mod:`core.tls`): with a certificate and key (0600) it
        speaks HTTPS only; a client certificate must be one the CA signed.
    """

    model_config = SettingsConfigDict(
        env_prefix="FEDFAAS_ENGINE_", extra="ignore", populate_by_name=True
    )

    MODULE: ClassVar[str] = "cache_engine"
    DESCRIPTION: ClassVar[str] = "FLStore cache engine"
    FLAG_NAMES: ClassVar[dict[str, str]] = {
        "redis_url": "--redis",
        "minio_endpoint": "--minio",
        "runtime_url": "--runtime",
    }

    host: str = "127.0.0.1"
    port: int = 8091
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_credentials_file: Path | None = None
    minio_endpoint: str = "127.0.0.1:9000"
    minio_credentials_file: Path | None = None
    bucket: str = "fedfaas"
    runtime_url: str = "http://127.0.0.1:8080"
    runtime_auth_dir: str | None = None
    policy: str = "flstore"
    capacity_objects: int = 256
    function_capacity_bytes: int = 1 << 30
    secondaries: int = Field(default=1, ge=0)
    max_functions: int = 8
    node_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("FEDFAAS_ENGINE_NODE_MEMORY_BYTES", NODE_MEMORY_VAR),
    )
    store_root: Path | None = None
    query_memory_bytes: int = Field(default=1 << 30, ge=0)
    ping_interval: float = 1.0
    ping_timeout: float = 2.0
    dead_after: int = 3
    evict_grace: float = 2.0
    call_timeout: float = 120.0
    run_timeout: float = 1800.0
    function_prefix: str = "flstore-cache-"
    function_image: str = "ghcr.io/fedfaas/flstore:0.1.0"
    handler_dir: str = str(_REPO / "functions" / "flstore")
    function_env: dict[str, str] = Field(default_factory=dict)
    admin_token_file: Path | None = None
    service_token_file: Path | None = None
    function_token_file: Path | None = None
    stop_grace: float = 20.0
