"""Settings of the operations console (env prefix ``FEDFAAS_CONSOLE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from control_plane.settings import parse_gateways
from core.cmdline import CommandLineSettings
from core.tls import TlsSettings


class ConsoleSettings(CommandLineSettings, TlsSettings):
    """Where the console finds the services it shows, and the secret files it reads.

    Attributes
    ----------
    control_plane_url, tracker_url, runtime_url
        The control plane (jobs, nodes), FLStore's request tracker (queries) and the OpenFaaS
        provider (functions; the embedded runtime or OpenFaaS's gateway).
    gateways
        The node gateways, ``node=url,node=url`` (their health and router mode).
    prometheus_url
        A Prometheus that scrapes the node gateways' ``/metrics`` (with the admin secret): the
        data plane's ingest rates then come from it; empty: from the console's own polls.
    minio_endpoint, minio_console_url, bucket
        MinIO (``host:port``) with the checkpoints, its web console, the checkpoint bucket.
    admin_token_file
        The platform's admin secret (the control plane's and the gateways' admin): who logs
        in with it may stop jobs; required.
    analyst_token_file
        The read-only analyst token: who logs in with it sees everything and changes nothing.
        The console also reads with it from the control plane and the tracker.
    minio_credentials_file
        A MinIO user that may list and read the bucket (the platform passes the cache
        engine's read-only user); checkpoint links are presigned with it.
    runtime_auth_dir
        The provider's basic-auth files (``GET /system/functions`` only).
    link_ttl_s
        Seconds a presigned checkpoint link stays valid.
    session_ttl_s
        Seconds a login lasts.
    secure_cookie
        Mark the session cookie ``Secure`` (behind TLS; a browser refuses it on plain HTTP
        to an address other than localhost).
    tls_cert_file, tls_key_file, tls_ca_file, tls_client_certs
        TLS (:mod:`core.tls`): with a certificate and key the console serves HTTPS only, and
        its calls of the services verify them against the CA and present its certificate.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_CONSOLE_", extra="ignore")

    MODULE: ClassVar[str] = "console"
    DESCRIPTION: ClassVar[str] = "FedFaaS operations console"
    FLAGS: ClassVar[dict[str, str]] = {
        "host": "--host",
        "port": "--port",
        "control_plane_url": "--control-plane",
        "tracker_url": "--tracker",
        "runtime_url": "--runtime",
        "gateways": "--gateways",
        "prometheus_url": "--prometheus",
        "minio_endpoint": "--minio",
        "minio_console_url": "--minio-console",
        "bucket": "--bucket",
        "admin_token_file": "--admin-token-file",
        "analyst_token_file": "--analyst-token-file",
        "minio_credentials_file": "--minio-credentials-file",
        "runtime_auth_dir": "--runtime-auth-dir",
        "link_ttl_s": "--link-ttl",
        "session_ttl_s": "--session-ttl",
        "secure_cookie": "--secure-cookie",
        "tls_cert_file": "--tls-cert-file",
        "tls_key_file": "--tls-key-file",
        "tls_ca_file": "--tls-ca-file",
        "tls_client_certs": "--tls-client-certs",
    }

    host: str = "127.0.0.1"
    port: int = 8060
    control_plane_url: str = "http://127.0.0.1:8070"
    tracker_url: str = "http://127.0.0.1:8092"
    runtime_url: str = "http://127.0.0.1:8080"
    gateways: str = ""
    prometheus_url: str = ""
    minio_endpoint: str = "127.0.0.1:9000"
    minio_console_url: str = ""
    bucket: str = "fedfaas"
    admin_token_file: Path | None = None
    analyst_token_file: Path | None = None
    minio_credentials_file: Path | None = None
    runtime_auth_dir: Path | None = None
    link_ttl_s: int = 300
    session_ttl_s: int = 8 * 3600
    secure_cookie: bool = False

    def gateway_map(self) -> dict[str, str]:
        """``gateways`` as node -> URL (the control plane's parser: the same flag, the same
        errors)."""
        return parse_gateways(self.gateways) if self.gateways.strip() else {}
