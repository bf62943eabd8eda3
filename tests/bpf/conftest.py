"""Fixtures: a started RouterServer for each backend of the contract suite."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import bpf
from bpf import Kind


@functools.cache
def ebpf_probe() -> tuple[str, str]:
    return bpf.probe()


def _backend_param(name: str) -> object:
    if name == "ebpf":
        return pytest.param("ebpf", marks=pytest.mark.bpf, id="ebpf")
    return pytest.param("userspace", id="userspace")


BACKENDS = [_backend_param("userspace"), _backend_param("ebpf")]


class Disconnects(list[int]):
    """Endpoint ids passed to on_disconnect, in order."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "ebpf":
        mode, reason = ebpf_probe()
        if mode != "ebpf":
            pytest.skip(f"eBPF sidecar cannot load on this machine: {reason}")
    return name


@pytest.fixture()
def disconnects() -> Disconnects:
    return Disconnects()


@pytest.fixture()
def router(backend: str, tmp_path: Path, disconnects: Disconnects) -> Iterator[bpf.RouterServer]:
    server = bpf.RouterServer(
        str(tmp_path / "router.sock"),
        prefer_ebpf=backend == "ebpf",
        on_disconnect=disconnects.append,
    ).start()
    assert server.mode == backend, server.reason
    try:
        yield server
    finally:
        server.stop()


def join(router: bpf.RouterServer, job: int, role: str = "aggregator") -> bpf.Endpoint:
    """Register an endpoint with ``router`` and grant it ``job``, as the gateway does.

    The store folder granted is the router socket's directory (any existing folder will do).
    Returns once the endpoint has taken its GRANT (``ep.job == job``).
    """
    ep = bpf.connect(router.socket_path, role)
    try:
        router.grant(ep.id, job, os.path.dirname(router.socket_path))
        grant = ep.recv(timeout=5)
        assert grant is not None and grant.kind is Kind.GRANT, grant
        assert (grant.job, grant.src, grant.dst, ep.job) == (job, 0, ep.id, job), grant
        assert ep.store_fd is not None
    except BaseException:
        ep.close()
        raise
    return ep
