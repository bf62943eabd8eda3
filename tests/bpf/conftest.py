"""Fixtures: a started RouterServer for each backend of the contract suite."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import bpf


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
