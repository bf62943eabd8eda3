"""What a part needs to know to build its command line: folders, ports, secrets, addresses."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.tls import CA_FILE_ENV
from fedfaas.platform import credentials

#: Environment variable that marks every process of one platform (inherited by children).
PLATFORM_ID_VAR = "FEDFAAS_PLATFORM_ID"

#: The ports that speak HTTPS on a platform started with ``fedfaas up`` (TLS, its default;
#: MinIO, Redis, Prometheus and OpenFaaS's own gateway stay plain, on loopback).
TLS_PORTS = frozenset(
    {
        "runtime",
        "gateway",
        "gateway_node1",
        "cache_engine",
        "request_tracker",
        "control_plane",
        "console",
    }
)

#: The parts only the platform's own parts call (and ``fedfaas``, with its certificate): on a
#: TLS platform they require a client certificate the CA signed. The others take the SDK,
#: faas-cli or a browser, which have none: their certificates are optional (checked when
#: presented). The function replicas require one too (the runtime's ``function_tls_*``).
INTERNAL_PARTS = frozenset({"cache-engine"})


@dataclass
class Context:
    """One platform instance: its state folder, loopback host and the ports of its parts.

    ``ports`` maps port names (``"runtime"``, ``"minio"``, ``"minio_console"``, ``"redis"``,
    and those of parts added later) to the port chosen by ``up``.
    """

    state_dir: Path
    host: str
    stack_file: Path
    platform_id: str
    ports: dict[str, int] = field(default_factory=dict)
    stop_timeout: float = 40.0
    functions_timeout: float = 60.0
    #: OpenFaaS's gateway binary (``fedfaas up --openfaas-gateway``), None without one
    openfaas_gateway: Path | None = None
    #: the memory file system of the node gateways' object stores (``--shm-dir``)
    shm_dir: Path = Path("/dev/shm")
    #: ``fedfaas up`` (TLS by default, not ``--no-tls``): the parts of :data:`TLS_PORTS` serve
    #: HTTPS with certificates from :attr:`tls_dir` (:mod:`fedfaas.platform.pki`) and call
    #: each other over mTLS
    tls: bool = False

    @classmethod
    def of(cls, st: Any) -> Context:
        """The context of a recorded platform (a :class:`~fedfaas.platform.state.PlatformState`),
        with the default timeouts."""
        return cls(
            state_dir=Path(st.state_dir),
            host=st.host,
            stack_file=Path(st.stack_file),
            platform_id=st.platform_id,
            ports=dict(st.ports),
            shm_dir=Path(st.shm_dir),
            tls=st.tls,
        )

    @property
    def secrets_dir(self) -> Path:
        return self.state_dir / "secrets"

    def data_dir(self, part: str) -> Path:
        """Persistent data of ``part`` (removed by ``down``)."""
        return self.state_dir / "data" / part

    def run_dir(self, part: str) -> Path:
        """Runtime state of ``part`` (removed by ``down``)."""
        return self.state_dir / "run" / part

    def log_path(self, part: str) -> Path:
        return self.state_dir / "logs" / f"{part}.log"

    @property
    def tls_dir(self) -> Path:
        """The platform's CA and its parts' certificates and keys (0600 files)."""
        return self.secrets_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The platform's CA certificate: what the SDK's ``ca_file`` names."""
        return self.tls_dir / "ca.crt"

    def url(self, port_name: str, scheme: str | None = None) -> str:
        """``scheme://host:port`` of ``port_name``; the scheme by default ``https`` for a
        port of :data:`TLS_PORTS` on a TLS platform, else ``http``."""
        if scheme is None:
            scheme = "https" if self.tls and port_name in TLS_PORTS else "http"
        return f"{scheme}://{self.host}:{self.ports[port_name]}"

    def tls_settings(self, part: str) -> dict[str, Any]:
        """The ``tls_*`` settings (:class:`core.tls.TlsSettings`) that make ``part`` serve
        HTTPS with its own certificate and call the others with it; none without TLS. A part
        of :data:`INTERNAL_PARTS` requires a client certificate the CA signed (mTLS)."""
        if not self.tls:
            return {}
        return {
            "tls_cert_file": self.tls_dir / f"{part}.crt",
            "tls_key_file": self.tls_dir / f"{part}.key",
            "tls_ca_file": self.ca_file,
            **({"tls_client_certs": "required"} if part in INTERNAL_PARTS else {}),
        }

    def function_tls_settings(self) -> dict[str, Any]:
        """The runtime's ``function_tls_*`` settings: its replicas serve HTTPS with the
        ``functions`` certificate and present it when they call the parts; none without TLS."""
        if not self.tls:
            return {}
        return {
            "function_tls_cert_file": self.tls_dir / "functions.crt",
            "function_tls_key_file": self.tls_dir / "functions.key",
        }

    def client_ssl(self) -> ssl.SSLContext | None:
        """How ``fedfaas`` itself calls the parts (probes, deploys): verifying them against
        the platform's CA and presenting its own certificate; None without TLS."""
        if not self.tls:
            return None
        from core.tls import TlsFiles

        return TlsFiles(
            self.tls_dir / "fedfaas.crt", self.tls_dir / "fedfaas.key", self.ca_file
        ).client_context()

    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify`` for ``fedfaas``'s own calls (:meth:`client_ssl`)."""
        return self.client_ssl() or True

    def http_ok(self, url: str, timeout: float = 5.0) -> bool:
        """True when a GET of ``url`` answers 200 right now (over TLS: the server verified).

        ``timeout`` bounds a part that does not answer; it is not a speed check: on a busy
        machine a TLS handshake (``up``'s default) with a part that waits for a CPU can take
        over a second."""
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=self.client_ssl()) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def openfaas_url(self) -> str:
        """Where the components reach ``/system/*`` and ``/function/*``: OpenFaaS's gateway
        when it runs (``--openfaas-gateway``), else the runtime itself."""
        if "openfaas_gateway" in self.ports:
            return self.url("openfaas_gateway")
        return self.url("runtime")

    def basic_auth(self) -> tuple[str, str]:
        return credentials.basic_auth(self.secrets_dir)

    def env(self) -> dict[str, str]:
        """Environment every part (and every function replica) gets: where the others are.

        Secrets are passed as file paths, never as values.
        """
        env = {
            PLATFORM_ID_VAR: self.platform_id,
            "FEDFAAS_STATE_DIR": str(self.state_dir),
            "FEDFAAS_SECRETS_DIR": str(self.secrets_dir),
            # the OpenFaaS connector convention, as the Helm chart sets it
            "basic_auth": "true",
            "secret_mount_path": str(self.secrets_dir),
        }
        if "redis" in self.ports:
            env["FEDFAAS_REDIS_URL"] = f"{self.url('redis', 'redis')}/0"
        if "minio" in self.ports:
            env["FEDFAAS_MINIO_ENDPOINT"] = f"{self.host}:{self.ports['minio']}"
        if "runtime" in self.ports:
            env["FEDFAAS_RUNTIME_URL"] = self.url("runtime")
            env["OPENFAAS_URL"] = self.url("runtime")
        if self.tls:
            # the CA's certificate (public, not a secret) for the platform's clients that have
            # no certificate (:func:`core.tls.platform_verify`, in the functions); not
            # SSL_CERT_FILE, which would make a function's calls to outside https services
            # trust this CA alone
            env[CA_FILE_ENV] = str(self.ca_file)
        return env
