"""Fixtures of the control-plane tests: node-gateway processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.services import wait_for_port
from tests.ports import distinct_ports

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class GatewayProc:
    name: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _start(tmp_path: Path) -> Iterator[list[GatewayProc]]:
    procs: list[GatewayProc] = []
    try:
        for i, port in enumerate(distinct_ports(3)):
            log = open(tmp_path / f"gw{i}.log", "wb")  # noqa: SIM115 - handed to the child
            p = subprocess.Popen(
                [sys.executable, "-m", "tests.control.gateway_standin", "--port", str(port)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            procs.append(GatewayProc(f"node{i + 1}", port, p))
        for g in procs:
            wait_for_port("127.0.0.1", g.port, 30, g.proc)
        yield procs
    finally:
        for g in procs:
            if g.proc.poll() is None:
                g.proc.terminate()
                try:
                    g.proc.wait(10)
                except subprocess.TimeoutExpired:
                    g.kill()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProc]]:
    """Three node-gateway processes shared by a module (the stand-in; see gateway_standin.py)."""
    yield from _start(tmp_path_factory.mktemp("gateways"))


@pytest.fixture()
def own_gateways(tmp_path: Path) -> Iterator[list[GatewayProc]]:
    """Three node-gateway processes for one test (it may kill them)."""
    yield from _start(tmp_path)
