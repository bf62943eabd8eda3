"""Fixtures: the embedded runtime as a real child process on a free loopback port."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fedfaas.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS
from fedfaas.runtime import RuntimeProcess
from fedfaas.stackfile import load_stack

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "stack.yml"
USER, PASSWORD = "admin", "s3cret-pa55"
#: the function token of the test runtimes (every stack.yml function requires it)
FUNCTION_TOKEN = "test-function-token-0123456789"
FN_AUTH = {"Authorization": f"Bearer {FUNCTION_TOKEN}"}


def with_function_token(rt: RuntimeProcess, auth: tuple[str, str] | None = None) -> RuntimeProcess:
    """Create the runtime secret ``fedfaas-function-token`` (FUNCTION_TOKEN) on ``rt``."""
    with OpenFaaS(rt.url, auth) as gw:
        gw.set_secret(FUNCTION_TOKEN_SECRET, FUNCTION_TOKEN)
    return rt


def echo_body(service: str, **extra: object) -> dict[str, object]:
    """The FunctionDeployment faas-cli sends for stack.yml's echo, renamed to ``service``."""
    body = load_stack(STACK).functions["echo"].deployment()
    body["service"] = service
    body.update(extra)
    return body


def wait_until(
    predicate: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout:.0f}s")


def available(http: httpx.Client, name: str) -> int:
    r = http.get(f"/system/function/{name}")
    return int(r.json().get("availableReplicas", 0)) if r.status_code == 200 else -1


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """A runtime without auth, serving stack.yml's functions (ready wait 2s for quick 503s),
    with the function token secret."""
    rt = RuntimeProcess(
        stack=STACK, state_dir=tmp_path_factory.mktemp("runtime"), settings={"ready_wait": 2}
    ).start()
    try:
        yield with_function_token(rt)
    finally:
        rt.stop()


@pytest.fixture(scope="session")
def auth_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """A runtime with basic auth from files (with whitespace that must be trimmed)."""
    auth_dir = tmp_path_factory.mktemp("auth")
    (auth_dir / "basic-auth-user").write_text(f"{USER}\n")
    (auth_dir / "basic-auth-password").write_text(f"  {PASSWORD}\n")
    rt = RuntimeProcess(
        stack=STACK, state_dir=tmp_path_factory.mktemp("runtime-auth"), auth_dir=auth_dir
    ).start()
    try:
        yield with_function_token(rt, (USER, PASSWORD))
    finally:
        rt.stop()


@pytest.fixture()
def http(runtime: RuntimeProcess) -> Iterator[httpx.Client]:
    """A client of ``runtime`` that sends the function token (auth is off on ``/system/*``)."""
    with httpx.Client(base_url=runtime.url, trust_env=False, timeout=60, headers=FN_AUTH) as client:
        yield client
