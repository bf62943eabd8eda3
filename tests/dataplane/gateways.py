"""The gateway fixtures the data-plane tests share, in a plain module so that other folders import
them from here (tests/tls, tests/secagg, tests/flstore), never from a conftest.py.

A module that uses :func:`make_gw` imports it *with every fixture of this module it depends on*
(today :func:`gateway_extra`): pytest finds a fixture's dependencies by name in the test's own
module or its conftests, so a dependency left behind errors the module's tests with "fixture
'...' not found". tests/dataplane/test_gateway_fixtures.py checks every importer for that.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dataplane.gwutil import GatewayThread, settings


@pytest.fixture()
def gateway_extra() -> dict[str, object]:
    """Settings every gateway of :func:`make_gw` gets (none here; tests/tls adds TLS's)."""
    return {}


@pytest.fixture()
def make_gw(
    tmp_path: Path, redis_url: str, gateway_extra: dict[str, object]
) -> Iterator[Callable[..., GatewayThread]]:
    """Start gateways in threads; stop each after the test and remove its store root (a stop
    leaves the stores for the gateway's next start)."""
    made: list[GatewayThread] = []

    def make(**kw: object) -> GatewayThread:
        g = GatewayThread(settings(tmp_path, redis_url, **gateway_extra, **kw)).start()
        made.append(g)
        return g

    yield make
    for g in made:
        g.stop()
        shutil.rmtree(g.settings.shm_root, ignore_errors=True)


@pytest.fixture()
def checkpoints_to(minio_server, minio_root_credentials):  # type: ignore[no-untyped-def]
    """Gateway settings that checkpoint into a bucket of the test's own (as MinIO's root)."""

    def settings(bucket: str) -> dict[str, object]:
        return {
            "minio_endpoint": minio_server.endpoint,
            "minio_credentials_file": minio_root_credentials,
            "minio_bucket": bucket,
        }

    return settings
