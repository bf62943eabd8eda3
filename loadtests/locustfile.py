"""Analysts sending a mix of FLStore queries to the request tracker.

Headless, against the request tracker of ``fedfaas up`` (TLS, its default)::

    locust -f loadtests/locustfile.py --headless -u 8 -r 4 -t 30s --host https://127.0.0.1:PORT

Environment: ``FLSTORE_JOB`` (default: the first job the engine knows, read from
``FLSTORE_ENGINE`` = the engine URL, else ``demo``), ``FLSTORE_ROUNDS`` (e.g. ``1-10``; default:
the job's written rounds from the engine, else ``1-3``), ``FLSTORE_SECRETS`` (the platform's
secrets folder, default ``.state/secrets``: queries carry ``analyst-token``, the engine is read
with ``admin-token``; paths only, never token values in the environment), ``FLSTORE_CA_FILE``
(the platform's CA certificate, which the users verify ``https://`` addresses against; by
default ``FLSTORE_SECRETS/tls/ca.crt``, where ``fedfaas up`` writes it; on ``fedfaas up
--no-tls`` the addresses are ``http://`` and no CA is used). Over TLS the engine requires a
client certificate the platform's CA signed: its read presents ``fedfaas``'s own
(``FLSTORE_SECRETS/tls/fedfaas.crt``). Every query is synchronous (``?wait=true``); a 4xx or
5xx counts as a failure in locust's statistics.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import httpx
from locust import HttpUser, between, task

from loadtests.platform_ca import ca_file, platform_client, trust

SECRETS = Path(os.environ.get("FLSTORE_SECRETS", ".state/secrets"))
CA_FILE = ca_file(os.environ.get("FLSTORE_CA_FILE", ""), SECRETS)


def _bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {(SECRETS / name).read_text().strip()}"}


def _job_and_rounds() -> tuple[str, list[int]]:
    job = os.environ.get("FLSTORE_JOB", "")
    rounds: list[int] = []
    engine = os.environ.get("FLSTORE_ENGINE", "")
    if engine:
        try:
            jobs = httpx.get(
                f"{engine}/v1/state",
                headers=_bearer("admin-token"),
                timeout=5,
                verify=platform_client(CA_FILE, SECRETS),
            ).json()["jobs"]
            job = job or next(iter(jobs), "")
            rounds = [r for r in jobs.get(job, []) if r >= 1]
        except (httpx.HTTPError, KeyError, ValueError, OSError):
            pass
    spec = os.environ.get("FLSTORE_ROUNDS", "")
    if spec:
        lo, _, hi = spec.partition("-")
        rounds = list(range(int(lo), int(hi or lo) + 1))
    return job or "demo", rounds or [1, 2, 3]


JOB, ROUNDS = _job_and_rounds()


class Analyst(HttpUser):
    """One analyst: per-round checks most often, cross-round and metadata queries sometimes."""

    wait_time = between(0.2, 1.0)

    def on_start(self) -> None:
        trust(self.client, CA_FILE)
        self.round_i = random.randrange(len(ROUNDS))
        self.client.headers.update(_bearer("analyst-token"))

    def _next_round(self) -> int:
        self.round_i = (self.round_i + 1) % len(ROUNDS)
        return ROUNDS[self.round_i]

    def _query(self, name: str, body: dict[str, Any]) -> None:
        with self.client.post(
            "/v1/queries?wait=true", json={"job": JOB, **body}, name=name, catch_response=True
        ) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
            elif r.json().get("status") != "done":
                r.failure(f"status {r.json().get('status')}")

    @task(4)
    def malicious_filtering(self) -> None:
        self._query(
            "cosine-to-aggregate",
            {
                "workload": "cosine-to-aggregate",
                "rounds": [self._next_round()],
                "params": {"bottom_k": 1},
            },
        )

    @task(3)
    def robust_aggregation(self) -> None:
        self._query(
            "multi-krum",
            {"workload": "multi-krum", "rounds": [ROUNDS[self.round_i]], "params": {"f": 1}},
        )

    @task(2)
    def hyperparameter_tracking(self) -> None:
        self._query(
            "track", {"workload": "track", "rounds": [ROUNDS[-1]], "params": {"window": 10}}
        )

    @task(1)
    def clustering(self) -> None:
        self._query(
            "kmeans",
            {
                "workload": "kmeans",
                "rounds": [ROUNDS[self.round_i]],
                "params": {"k": 2, "n_init": 1},
            },
        )

    @task(1)
    def provenance(self) -> None:
        if len(ROUNDS) < 2:
            return
        i = random.randrange(1, len(ROUNDS))
        self._query(
            "provenance",
            {
                "workload": "provenance",
                "params": {"first_round": ROUNDS[i - 1], "last_round": ROUNDS[i]},
            },
        )

    @task(1)
    def bad_query(self) -> None:
        """A malformed query must get a 4xx quickly (counted as success when it does)."""
        with self.client.post(
            "/v1/queries?wait=true",
            json={"workload": "multi-krum", "job": JOB, "rounds": [10**6]},
            name="bad-query (expect 404)",
            catch_response=True,
        ) as r:
            if r.status_code == 404:
                r.success()
            else:
                r.failure(f"expected 404, got {r.status_code}")
