"""Settings of the coordinator service (env prefix ``FEDFAAS_CONTROL_``; the CLI wins)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from control_plane.errors import InvalidInput
from core.cmdline import CommandLineSettings
from core.discovery import parse_service
from core.tls import TlsSettings


class ControlPlaneSettings(CommandLineSettings, TlsSettings):
    """Everything ``python -m control_plane`` reads; every default works on one machine.

    Attributes
    ----------
    host, port
        Where the coordinator API listens (loopback by default).
    gateways
        ``node1=http://127.0.0.1:8101,node2=...``: node gateways by node name (these entries
        win over discovered ones).
    gateways_service
        ``HOST:PORT`` of a DNS name that resolves to every node gateway (the chart's headless
        Service ``<release>-node-gateway-peers``). Each address's ``/healthz`` names its node
        (:mod:`core.discovery`); every ``discovery_interval`` seconds new nodes join
        placement and a node found at a new address (a restarted pod) is reached there. With
        it the service starts while no gateway answers yet; a job created then is answered
        503 ``no_healthy_nodes``. ``gateways``, this, or both are needed.
    discovery_interval
        Seconds between two lookups of ``gateways_service``.
    redis_url
        Redis for job state (empty: in memory, lost on restart).
    redis_credentials_file
        The control plane's Redis user (a 0600 credentials file, see
        :mod:`core.secretfiles`); required with ``redis_url``.
    provider_url
        OpenFaaS provider API (embedded runtime or gateway) used to scale ``function``;
        empty: no autoscaling.
    provider_auth_dir
        Folder with ``basic-auth-user`` / ``basic-auth-password`` for ``/system/*``.
    function
        Name of the aggregator function to scale.
    mc
        Maximum service capacity of each node (updates aggregated concurrently); measure
        it with :func:`control_plane.calibrate.calibrate`.
    tick_s
        Control period: health probes, progress polls, deadline checks.
    health_failures
        Consecutive failed ``/healthz`` probes before a node leaves placement.
    node_grace_s
        ... and for at least this many seconds: a gateway that restarts (its supervisor or
        kubelet starts it again in a second or two) keeps its place and its rounds.
    close_retries
        Failed attempts at closing a round on its gateways after its deadline (one gateway
        down, refusing, timing out; tried again with a growing pause) before the job fails.
    alpha
        EWMA coefficient of the queue estimate (0.7 in the paper).
    scale_down_s
        Seconds every node must be idle before ``function`` scales back to its minimum.
    admin_token_file
        The gateways' admin secret (their ``<state_dir>/admin-secret``), sent as the bearer
        token when the coordinator creates jobs on them; also this service's admin token, and
        the key of the client tokens ``GET /v1/jobs/{job}/assignment`` accepts.
    analyst_token_file
        Token of the read-only analyst scope (``GET`` of nodes, jobs, plans); optional.
    tracker_url
        FLStore's request tracker, asked for the clients of rounds of jobs created with
        ``selection="oort"`` (:mod:`control_plane.selection`); empty: such rounds are random,
        and their ``selection_note`` says so.
    tracker_token_file
        A token the tracker accepts for queries (its analyst token file); required with
        ``tracker_url``.
    selection_timeout_s
        Seconds a round's Oort selection may take (waiting for the previous round to reach
        FLStore included) before the round is selected at random.
    stop_grace
        Seconds a SIGTERM leaves the service to stop (:func:`core.shutdown.serve`): in-flight
        requests get half, then are cancelled; a second signal or the end exits 1 at once.
    tls_cert_file, tls_key_file, tls_ca_file, tls_client_certs
        TLS for the API (:mod:`core.tls`): with a certificate and key (0600) the port speaks
        HTTPS only; a client certificate must be one the CA signed (``"required"``: mTLS).
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_CONTROL_")

    MODULE: ClassVar[str] = "control_plane"
    DESCRIPTION: ClassVar[str] = "FedFaaS control plane (LIFL coordinator)"
    FLAGS: ClassVar[dict[str, str]] = {
        "host": "--host",
        "port": "--port",
        "gateways": "--gateways",
        "gateways_service": "--gateways-service",
        "discovery_interval": "--discovery-interval",
        "redis_url": "--redis",
        "redis_credentials_file": "--redis-credentials-file",
        "provider_url": "--provider",
        "provider_auth_dir": "--provider-auth-dir",
        "function": "--function",
        "mc": "--mc",
        "tick_s": "--tick",
        "health_failures": "--health-failures",
        "node_grace_s": "--node-grace",
        "close_retries": "--close-retries",
        "alpha": "--alpha",
        "scale_down_s": "--scale-down",
        "admin_token_file": "--admin-token-file",
        "analyst_token_file": "--analyst-token-file",
        "tracker_url": "--tracker",
        "tracker_token_file": "--tracker-token-file",
        "selection_timeout_s": "--selection-timeout",
        "stop_grace": "--stop-grace",
        "tls_cert_file": "--tls-cert-file",
        "tls_key_file": "--tls-key-file",
        "tls_ca_file": "--tls-ca-file",
        "tls_client_certs": "--tls-client-certs",
    }

    host: str = "127.0.0.1"
    port: int = 8070
    gateways: str = ""
    gateways_service: str = ""
    discovery_interval: float = Field(default=10.0, gt=0)
    redis_url: str = ""
    redis_credentials_file: Path | None = None
    provider_url: str = ""
    provider_auth_dir: Path | None = None
    function: str = "aggregator"
    mc: float = 20.0
    tick_s: float = 0.5
    health_failures: int = 2
    node_grace_s: float = Field(default=10.0, ge=0)
    close_retries: int = Field(default=6, ge=0)
    alpha: float = 0.7
    scale_down_s: float = 30.0
    admin_token_file: Path | None = None
    analyst_token_file: Path | None = None
    tracker_url: str = ""
    tracker_token_file: Path | None = None
    selection_timeout_s: float = Field(default=10.0, gt=0, le=300)
    stop_grace: float = 20.0

    @field_validator("tracker_url")
    @classmethod
    def _tracker_address(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be http://HOST:PORT of FLStore's request tracker")
        return value

    @model_validator(mode="after")
    def _tracker_token(self) -> Self:
        if self.tracker_url and self.tracker_token_file is None:
            raise ValueError(
                "--tracker needs --tracker-token-file (a file with the tracker's analyst token)"
            )
        return self

    @field_validator("gateways_service")
    @classmethod
    def _service_address(cls, value: str) -> str:
        if value:
            parse_service(value)  # ValueError: the flag is named in the error
        return value

    def gateway_map(self) -> dict[str, str]:
        """Parse :attr:`gateways` into ``{node: url}`` (empty only with ``gateways_service``).

        Raises
        ------
        InvalidInput
            A malformed entry, or neither ``gateways`` nor ``gateways_service`` given.
        """
        if self.gateways_service and not self.gateways.strip():
            return {}
        return parse_gateways(self.gateways)


def parse_gateways(text: str) -> dict[str, str]:
    """``"n1=http://a,n2=http://b"`` -> ``{"n1": "http://a", "n2": "http://b"}``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, url = part.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or ":" in name or not url.startswith(("http://", "https://")):
            raise InvalidInput(
                f"bad gateway entry {part!r}: use NAME=http://HOST:PORT (NAME without ':')"
            )
        if name in out:
            raise InvalidInput(f"node {name!r} is listed twice in --gateways")
        out[name] = url.rstrip("/")
    if not out:
        raise InvalidInput(
            "no gateways given: pass --gateways node1=http://127.0.0.1:PORT,... "
            "or --gateways-service HOST:PORT"
        )
    return out
