"""Debian's Prometheus on loopback, scraping the parts' ``/metrics``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


from core.services.process import (
    Server,
    ServiceError,
    find_binary,
    free_port,
    http_ok,
)

log = logging.getLogger(__name__)


@dataclass
class PrometheusServer(Server):
    """Debian's ``prometheus`` on a loopback port, scraping ``targets`` (``host:port`` each,
    path ``/metrics``; no credential) and ``bearer_targets`` (with the bearer token of
    ``bearer_file``) every ``scrape_interval``; its TSDB in ``data_dir/tsdb``.

    OpenFaaS's gateway needs one: it reads its functions' invocation counts from Prometheus'
    query API (``faas_prometheus_host``/``faas_prometheus_port``) and has no way to send a
    credential there, so this server has no login. It therefore listens on loopback only and
    holds nothing but the metrics of what it scrapes. Its configuration is ``prometheus.yml``
    in ``data_dir``, written by :meth:`prepare`.
    """

    targets: list[str] = field(default_factory=list)
    scrape_interval: str = "1s"
    #: targets whose ``/metrics`` need a bearer token (the node gateways': the admin secret)
    bearer_targets: list[str] = field(default_factory=list)
    #: the file holding that token; Prometheus reads it at each scrape, so it may appear
    #: after the start (the first node gateway writes the admin secret)
    bearer_file: Path | None = None
    #: ``(ca_file, cert_file, key_file)`` when the bearer targets serve HTTPS: they are then
    #: scraped over https, verified against the CA, presenting the certificate (files the
    #: ``prometheus`` process must be able to read)
    bearer_tls: tuple[Path, Path, Path] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "prometheus.yml"

    def prepare(self) -> None:
        """Write ``prometheus.yml``: job ``fedfaas`` over :attr:`targets` and, when there are
        any, job ``fedfaas-bearer`` over :attr:`bearer_targets` with the token of
        :attr:`bearer_file` (over https with :attr:`bearer_tls`)."""
        import json

        if self.bearer_targets and self.bearer_file is None:
            raise ServiceError("prometheus: bearer_targets need a bearer_file")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # YAML is a superset of JSON: the lists of targets and the path are written as JSON
        lines = [
            "global:",
            f"  scrape_interval: {self.scrape_interval}",
            f"  evaluation_interval: {self.scrape_interval}",
            "scrape_configs:",
            "  - job_name: fedfaas",
            "    static_configs:",
            f"      - targets: {json.dumps(list(self.targets))}",
        ]
        if self.bearer_targets:  # the secret stays in its file, read by Prometheus
            lines += [
                "  - job_name: fedfaas-bearer",
                "    static_configs:",
                f"      - targets: {json.dumps(list(self.bearer_targets))}",
                "    authorization:",
                "      type: Bearer",
                f"      credentials_file: {json.dumps(str(self.bearer_file))}",
            ]
            if self.bearer_tls is not None:
                ca, cert, key = (json.dumps(str(f)) for f in self.bearer_tls)
                lines += [
                    "    scheme: https",
                    "    tls_config:",
                    f"      ca_file: {ca}",
                    f"      cert_file: {cert}",
                    f"      key_file: {key}",
                ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        """The ``prometheus`` command line: the configuration of :meth:`prepare`, the TSDB in
        ``data_dir/tsdb``, the web API on ``host:port``."""
        binary = find_binary("prometheus")
        if binary is None:
            raise ServiceError(
                "prometheus not found: run `make setup` (apt-get install prometheus)"
            )
        return [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--log.level=warn",
        ]

    def ready(self, timeout: float = 1.0) -> bool:
        """True when ``/-/ready`` answers 200 right now."""
        return http_ok(f"{self.url}/-/ready", timeout)

    def query(self, promql: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The result vector of the instant query ``promql`` (``/api/v1/query``)."""
        import json
        import urllib.parse
        import urllib.request

        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.load(r)
        if doc.get("status") != "success":
            raise ServiceError(f"prometheus query {promql!r} failed: {doc}")
        return list(doc["data"]["result"])

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.port = self.port or free_port(self.host)
        self.prepare()
        self._start(self.command(), lambda: self._wait_ready("prometheus", self.ready, timeout))
        log.info(
            "prometheus on %s scraping %s (pid %s)",
            self.url,
            self.targets + self.bearer_targets,
            self.pid,
        )
        return self
