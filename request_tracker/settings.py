"""Settings of the request tracker (env prefix ``FEDFAAS_TRACKER_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from core.cmdline import CommandLineSettings
from core.tls import TlsSettings


class TrackerSettings(CommandLineSettings, TlsSettings):
    """Where the tracker finds the engine, the functions and Redis, and how long it waits.

    Attributes
    ----------
    redis_url, redis_credentials_file
        Redis (the location table, query records) and the tracker's user there (a 0600
        credentials file, see :mod:`core.secretfiles`; required).
    query_timeout
        Seconds a cache function gets to answer a query before the tracker re-routes it to the
        next holder (a secondary).
    long_query_timeout
        The same for a query that evaluates models on a validation set or runs over a round
        held in parts (its plan has ``slices``): it may rightly take minutes (GTG-Shapley on a
        round of 200 ResNet-18 updates), and asking again would run it twice at once.
    attempts
        Rounds of (acquire, try every holder) before a query fails.
    engine_wait
        Seconds a query waits for a cache engine that refuses connections (restarting) before
        it fails with 503 ``engine_unavailable``.
    direct_functions
        Call a cache function's ``/run`` at its replica's own address where the engine knows
        one (the embedded runtime gives each replica a loopback address; the hop through the
        gateway is about a millisecond on a 2-core machine); off, or where no address is
        known (Kubernetes: faas-netes gives none), every call goes through the gateway.
    plan_reuse
        Keep the engine's plans of queries whose objects are cached (and its answers to
        metadata-only queries), and answer the same query again without asking the engine
        (see :mod:`request_tracker.tracker`); off (``--no-plan-reuse``), every query asks the
        engine.
    ping_interval
        Seconds between the tracker's liveness pings of the cache functions (0 = off).
    result_ttl
        Seconds a finished background query's record stays in Redis (its answer is read with
        ``GET /v1/queries/{id}``).
    answered_ttl
        Seconds the record of a query answered in its own request (``?wait=true``) stays:
        the answer already went back, so Redis does not grow with every query of the day
        (the soak saw it double in 10 minutes with a day's TTL).
    admin_token_file, analyst_token_file
        Secret files (0600) of the admin scope (required) and of the analyst scope (queries).
    engine_token_file
        The cache engine's service token, sent on every call to the engine.
    function_token_file
        The function token (the runtime secret ``fedfaas-function-token``), sent to the cache
        functions (``/run``, ``/ping``) as ``Authorization: Bearer``; required.
    stop_grace
        Seconds a SIGTERM leaves the service to stop (:func:`core.shutdown.serve`): in-flight
        requests get half, then are cancelled; a second signal or the end exits 1 at once.
    tls_cert_file, tls_key_file, tls_ca_file, tls_client_certs
        TLS for the service's port (:mod:`core.tls`): with a certificate and key (0600) it
        speaks HTTPS only; a client certificate must be one the CA signed.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_TRACKER_", extra="ignore")

    MODULE: ClassVar[str] = "request_tracker"
    DESCRIPTION: ClassVar[str] = "FLStore request tracker"
    FLAG_NAMES: ClassVar[dict[str, str]] = {
        "redis_url": "--redis",
        "engine_url": "--engine",
        "runtime_url": "--runtime",
    }

    host: str = "127.0.0.1"
    port: int = 8092
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_credentials_file: Path | None = None
    engine_url: str = "http://127.0.0.1:8091"
    runtime_url: str = "http://127.0.0.1:8080"
    query_timeout: float = 30.0
    long_query_timeout: float = 1800.0
    engine_timeout: float = 300.0
    attempts: int = 3
    engine_wait: float = 15.0
    direct_functions: bool = True
    plan_reuse: bool = True
    ping_interval: float = 2.0
    result_ttl: int = 3600
    answered_ttl: int = 60
    admin_token_file: Path | None = None
    analyst_token_file: Path | None = None
    engine_token_file: Path | None = None
    function_token_file: Path | None = None
    stop_grace: float = 20.0
