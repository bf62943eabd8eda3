"""What a part needs to know to build its command line: folders, ports, secrets, addresses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedfaas.platform import credentials

#: Environment variable that marks every process of one platform (inherited by children).
PLATFORM_ID_VAR = "FEDFAAS_PLATFORM_ID"


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

    def url(self, port_name: str, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.ports[port_name]}"

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
        return env
