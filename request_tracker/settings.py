"""Settings of the request tracker (env prefix ``FEDFAAS_TRACKER_``)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class TrackerSettings(BaseSettings):
    """Where the tracker finds the engine, the functions and Redis, and how long it waits.

    Attributes
    ----------
    query_timeout
        Seconds a cache function gets to answer a query before the tracker re-routes it to the
        next holder (a secondary).
    attempts
        Rounds of (acquire, try every holder) before a query fails.
    ping_interval
        Seconds between the tracker's liveness pings of the cache functions (0 = off).
    result_ttl
        Seconds a finished query's record stays in Redis.
    """

    model_config = SettingsConfigDict(env_prefix="FEDFAAS_TRACKER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8092
    redis_url: str = "redis://127.0.0.1:6379/0"
    engine_url: str = "http://127.0.0.1:8091"
    runtime_url: str = "http://127.0.0.1:8080"
    query_timeout: float = 30.0
    engine_timeout: float = 300.0
    attempts: int = 3
    ping_interval: float = 2.0
    result_ttl: int = 86400
