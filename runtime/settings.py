"""Settings of the embedded runtime (env prefix ``FEDFAAS_RUNTIME_``)."""

from __future__ import annotations

import ssl
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from core.cmdline import CommandLineSettings
from core.tls import TlsError, TlsFiles, TlsSettings, from_settings

try:
    VERSION = version("fedfaas")
except PackageNotFoundError:  # running from a source tree that is not installed
    VERSION = "0.0.0"


class RuntimeSettings(CommandLineSettings, TlsSettings):
    """Everything the runtime reads at start; every default works on one machine, and
    ``auth_dir`` has none: the runtime never serves ``/system/*`` without credentials.

    Attributes
    ----------
    stack:
        Stack file whose ``image -> handler`` entries say which folder runs for a deployed image.
        Re-read when it changes on disk, so new entries deploy without a restart.
    platform_stack:
        The platform's own functions (``stack.platform.yml``: the ``aggregator``, which the
        Helm chart deploys on Kubernetes rather than ``faas-cli deploy -f stack.yml``), read
        the same way after ``stack``. ``fedfaas up`` passes it.
    state_dir:
        Replica logs live under ``<state_dir>/functions/<name>/``.
    auth_dir:
        Folder with ``basic-auth-user`` and ``basic-auth-password``, the one user of basic auth
        on ``/system/*``. Required: without it ``python -m runtime`` exits 2 naming
        ``--auth-dir``, and without the files :func:`~runtime.app.create_app` raises
        ``ValueError`` naming the missing file. ``RuntimeProcess`` makes a random pair.
    ce_limits:
        Apply OpenFaaS CE's limits (scale labels <= 5, scale clamped to [1, 5], 15 functions).
        Off by default: FedFaaS runs more than five aggregator replicas on one node.
    max_replicas:
        Upper bound for a scale request when the function has no ``com.openfaas.scale.max`` label
        (the Pro autoscaler's default max is 20).
    upstream_timeout:
        Seconds the proxy waits on a replica (read/write of one chunk); generous because model
        updates are hundreds of MB (reference section 6).
    ready_wait:
        Seconds an invocation waits for a ready replica before answering 503 (the CE gateway
        waits for a replica the same way with ``scale_from_zero``). 0 answers 503 at once.
    nodes:
        The node gateways this runtime schedules replicas onto: node name -> that node's router
        socket. Each replica is placed on one node (the deployment's ``node=NAME`` or
        ``kubernetes.io/hostname=NAME`` constraint, else spread: the node with the fewest
        replicas of the function) and gets ``FEDFAAS_NODE`` and
        ``FEDFAAS_GATEWAY_ROUTER_SOCKET`` for it, as a pod on Kubernetes gets its node's
        hostPath socket. Empty: replicas get no node.
    redis_url, redis_credentials_file:
        The Redis that holds the queue of asynchronous calls (``/async-function/*``) and the
        PATH of the runtime's Redis credentials file (ACL user ``runtime``). Without
        ``redis_url`` those routes answer 501; with it, a missing or malformed credentials
        file stops :func:`~runtime.app.create_app` (``AuthConfigError``).
    async_max_body:
        Largest body (bytes) of an asynchronous call; a larger one is refused with 413.
    async_workers:
        How many asynchronous calls are invoked at once.
    async_max_attempts:
        Attempts of one asynchronous call (invoking it while no replica can take it, then
        delivering its callback) before it is dropped with a logged error.
    async_retry_backoff:
        Seconds before the second attempt; doubled for each further one (at most 60).
    async_claim_idle:
        Seconds after which a call held by a worker that stopped sending heartbeats (a runtime
        that died) is taken over by another worker.
    watchdog:
        OpenFaaS's of-watchdog binary: each replica runs it (HTTP mode) in front of the Docker
        template's server ``template/python3-http/index.py``, as on Kubernetes, instead of the
        embedded watchdog (README.md). Its metrics port is fixed (8081): one replica per machine
        at a time, and updates cannot roll (remove and deploy again).
    behind_gateway:
        The runtime is the provider behind OpenFaaS's own gateway (``fedfaas up
        --openfaas-gateway``): ``GET /system/info`` answers a provider's ``ProviderInfo``
        (``{"provider": name, "orchestration", "version"}``), which the gateway wraps in its
        own answer; otherwise the gateway's ``GatewayInfo`` (what faas-cli reads).
    tls_cert_file, tls_key_file, tls_ca_file, tls_client_certs:
        TLS for the runtime's port (:mod:`core.tls`): with a certificate and key (0600) it
        speaks HTTPS only, and a client certificate must be one the CA signed.
    function_tls_cert_file, function_tls_key_file:
        TLS for the replicas (``fedfaas up --tls`` gives the ``functions`` certificate): each
        embedded watchdog serves HTTPS with them on loopback and requires a client
        certificate ``tls_ca_file`` signed; the runtime reaches its replicas over HTTPS
        presenting its own certificate, and the replicas get the files in their environment
        (:func:`core.tls.replica_files`; their calls to the platform present them). Needs
        the runtime's own ``tls_*`` files and the embedded watchdog (:meth:`function_tls`).
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_RUNTIME_")

    MODULE: ClassVar[str] = "runtime"
    DESCRIPTION: ClassVar[str] = "FedFaaS embedded OpenFaaS-compatible runtime"
    NO_FLAG: ClassVar[frozenset[str]] = frozenset({"python"})

    host: str = "127.0.0.1"
    port: int = 8080
    stack: Path | None = None
    platform_stack: Path | None = None
    state_dir: Path = Path(".state/runtime")
    auth_dir: Path
    namespace: str = "openfaas-fn"
    ce_limits: bool = False
    max_functions: int = 15
    max_replicas: int = 20
    upstream_timeout: float = 300.0
    ready_wait: float = 30.0
    health_interval: float = 0.5
    health_timeout: float = 1.0
    failure_threshold: int = 6
    startup_timeout: float = 60.0
    stop_grace: float = 10.0
    python: str = sys.executable
    nodes: dict[str, Path] = {}
    redis_url: str | None = None
    redis_credentials_file: Path | None = None
    async_max_body: int = Field(default=16 * 1024 * 1024, ge=0)
    async_workers: int = Field(default=2, ge=1)
    async_max_attempts: int = Field(default=8, ge=1)
    async_retry_backoff: float = Field(default=1.0, ge=0)
    async_claim_idle: float = Field(default=30.0, gt=0)
    watchdog: Path | None = None
    behind_gateway: bool = False
    function_tls_cert_file: Path | None = None
    function_tls_key_file: Path | None = None

    def function_tls(self) -> TlsFiles | None:
        """The files the replicas serve HTTPS with (``None``: plain HTTP on loopback), client
        certificates required; :class:`core.tls.TlsError` when they cannot work: a file
        missing or readable by others, no CA, no certificate of the runtime's own to present
        to them, or of-watchdog (``watchdog``), which serves plain HTTP only."""
        files = from_settings(
            self.function_tls_cert_file, self.function_tls_key_file, self.tls_ca_file, "required"
        )
        if files is None:
            return None
        if self.tls() is None:
            raise TlsError(
                "function TLS needs the runtime's own certificate and key (--tls-cert-file, "
                "--tls-key-file): it presents them to its replicas"
            )
        if self.watchdog is not None:
            raise TlsError(
                "function TLS needs the embedded watchdog: of-watchdog serves plain HTTP"
            )
        return files

    def replica_verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify`` for the runtime's calls to its replicas: with function TLS the
        platform's CA and the runtime's own certificate (mTLS), else ``True`` (plain HTTP)."""
        own = self.tls() if self.function_tls() is not None else None
        return own.client_context() if own is not None else True
