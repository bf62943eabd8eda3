"""Real backing services (Redis, MinIO, Prometheus) as child processes on loopback.

Used by ``fedfaas up`` and by the test fixtures alike, so that what the tests exercise is
exactly what the platform runs. Each server takes a free loopback port unless one is given,
keeps its data under a folder of its own, and is stopped by PID (process group) on ``stop``.

Neither lets anyone in without a user: Redis has one ACL user per component and MinIO one user
per component with a policy on the checkpoint bucket, each with a random password in a
credentials file of its own (``credentials_file(user)``), which is what a component is given.
"""

from core.services.minio_server import (
    MINIO_ROOT_PASSWORD,
    MINIO_ROOT_USER,
    MinioServer,
    minio_policies,
    minio_user_file,
    provision_minio,
)
from core.services.process import (
    CACHE_DIR,
    ChildProcess,
    PortRangeFull,
    ServiceError,
    find_binary,
    free_port,
    free_ports,
    http_ok,
    redis_ping,
    spawn,
    stop_group,
    wait_for_port,
)
from core.services.prometheus_server import PrometheusServer
from core.services.redis_server import REDIS_USERS, RedisServer

__all__ = [
    "CACHE_DIR",
    "MINIO_ROOT_PASSWORD",
    "MINIO_ROOT_USER",
    "REDIS_USERS",
    "ChildProcess",
    "MinioServer",
    "PortRangeFull",
    "PrometheusServer",
    "RedisServer",
    "ServiceError",
    "find_binary",
    "free_port",
    "free_ports",
    "http_ok",
    "minio_policies",
    "minio_user_file",
    "provision_minio",
    "redis_ping",
    "spawn",
    "stop_group",
    "wait_for_port",
]
