"""The platform the demo runs on: exactly what ``fedfaas up --with all`` starts, in its own
state folder, always stopped again (``fedfaas down``) when the demo ends, however it ends."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fedfaas.platform import Platform, credentials, state
from fedfaas.platform.context import Context
from fedfaas.settings import load_settings

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Running:
    """A running platform: its parts' URLs and the secrets the demo needs. ``verify`` is how
    the demo's own calls check the parts (over TLS, ``fedfaas up``'s default: the platform's
    CA, presenting ``fedfaas``'s certificate, which the function replicas require)."""

    state_dir: Path
    urls: dict[str, str]  # port name (gateway, control_plane, ...) -> URL (https over TLS)
    host: str
    platform_id: str
    verify: ssl.SSLContext | bool = True
    tls: bool = False

    @property
    def secrets(self) -> Path:
        return self.state_dir / "secrets"

    @property
    def ca_file(self) -> str | None:
        """The platform's CA certificate, the SDK's ``ca_file`` (None without TLS)."""
        return str(self.secrets / "tls" / "ca.crt") if self.tls else None

    @property
    def gateways(self) -> dict[str, str]:
        """Node name -> gateway URL."""
        return {"node0": self.urls["gateway"], "node1": self.urls["gateway_node1"]}

    def admin_secret(self) -> str:
        """The secret the node gateways derive client tokens from."""
        return (self.secrets / "gateway-admin-secret").read_text().strip()

    def analyst_token(self) -> str:
        """The read-only token the demo asks the request tracker with."""
        return credentials.read(self.secrets, credentials.ANALYST_TOKEN)

    def minio(self) -> tuple[str, str, str]:
        """``(endpoint, user, password)`` of the platform's MinIO."""
        return (
            self.urls["minio"].removeprefix("http://"),
            credentials.read(self.secrets, credentials.MINIO_USER),
            credentials.read(self.secrets, credentials.MINIO_PASSWORD),
        )

    def replicas(self) -> list[dict[str, Any]]:
        """The ready replicas of the ``aggregator`` function (``/system/replicas/aggregator``)."""
        r = httpx.get(
            f"{self.urls['runtime']}/system/replicas/aggregator",
            auth=credentials.basic_auth(self.secrets),
            timeout=10,
            verify=self.verify,
        )
        r.raise_for_status()
        return [x for x in r.json() if x.get("state") == "ready"]

    def tasks_done(self) -> dict[int, int]:
        """Aggregation tasks each live replica has run, by pid, from the replica's own status."""
        token = credentials.read(self.secrets, credentials.FUNCTION_TOKEN)
        out = {}
        scheme = "https" if self.tls else "http"  # a TLS replica requires a certificate
        for rep in self.replicas():
            r = httpx.get(
                f"{scheme}://{self.host}:{rep['port']}/",
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
                verify=self.verify,
            )
            r.raise_for_status()  # a replica's status needs the function token, as any call
            st = r.json()
            out[int(rep["pid"])] = sum(int(e["tasks_done"]) for e in st["endpoints"])
        return out

    def endpoint_pids(self) -> dict[str, set[int]]:
        """Per node, the pids behind the router's function endpoints (the gateway's own aside)."""
        out = {}
        for node, url in self.gateways.items():
            headers = {"Authorization": f"Bearer {self.admin_secret()}"}
            r = httpx.get(f"{url}/v1/router", headers=headers, timeout=10, verify=self.verify)
            eps = r.json()["endpoints"]
            out[node] = {int(e["pid"]) for e in eps if not e["local"]}
        return out


def _stack_file() -> Path:
    here = Path.cwd() / "stack.yml"
    return here if here.is_file() else REPO / "stack.yml"


@contextmanager
def platform(state_dir: Path, **overrides: Any) -> Iterator[Running]:
    """``fedfaas up --with all`` in ``state_dir``; ``fedfaas down`` on exit, also on errors.

    ``overrides`` are :class:`fedfaas.settings.PlatformSettings` fields (ports, timeouts). A
    platform a killed demo left running in ``state_dir`` is stopped first.
    """
    fields = dict(overrides)
    if "stack_file" not in fields and "FEDFAAS_STACK_FILE" not in os.environ:
        fields["stack_file"] = _stack_file()
    settings = load_settings(state_dir=state_dir, with_parts=["all"], **fields)
    p = Platform(settings)
    if p.down():
        log.warning("stopped a platform an earlier demo left running in %s", state_dir)
    try:
        p.up()
        st = state.load(state_dir)
        assert st is not None, "the platform recorded no state"
        ctx = Context.of(st)
        urls = {name: ctx.url(name) for name in st.ports}
        yield Running(state_dir, urls, st.host, st.platform_id, ctx.verify(), st.tls)
    finally:
        p.down()
