"""Fixtures: the embedded runtime as a real child process on a free loopback port."""

from __future__ import annotations

import ssl
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS
from core.stackfile import load_stack
from runtime import RuntimeProcess

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "stack.yml"
USER, PASSWORD = "admin", "s3cret-pa55"
#: the function token of the test runtimes (every stack.yml function requires it)
FUNCTION_TOKEN = "test-function-token-0123456789"
FN_AUTH = {"Authorization": f"Bearer {FUNCTION_TOKEN}"}


def with_function_token(rt: RuntimeProcess, verify: ssl.SSLContext | bool = True) -> RuntimeProcess:
    """Create the runtime secret ``fedfaas-function-token`` (FUNCTION_TOKEN) on ``rt``
    (``verify``: how the runtime is verified where it serves TLS)."""
    with OpenFaaS(rt.url, rt.auth, verify=verify) as gw:
        gw.set_secret(FUNCTION_TOKEN_SECRET, FUNCTION_TOKEN)
    return rt


@contextmanager
def serving(rt: RuntimeProcess) -> Iterator[RuntimeProcess]:
    """Start ``rt`` with the function token secret (:func:`with_function_token`); stop it at
    the end."""
    rt.start()
    try:
        yield with_function_token(rt)
    finally:
        rt.stop()


class RuntimeAuth(httpx.Auth):
    """What a caller of the runtime sends: basic auth (``rt.auth``) on ``/system/*``, the
    function token elsewhere (``/function/*``); a request that sets its own ``Authorization``
    keeps it."""

    def __init__(self, rt: RuntimeProcess) -> None:
        self.basic = httpx.BasicAuth(*rt.auth)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if "authorization" in request.headers:
            yield request
        elif request.url.path.startswith("/system/"):
            yield from self.basic.auth_flow(request)
        else:
            request.headers["Authorization"] = FN_AUTH["Authorization"]
            yield request


def client(rt: RuntimeProcess, **kwargs: Any) -> httpx.Client:
    """An httpx client of ``rt`` with :class:`RuntimeAuth`."""
    return httpx.Client(base_url=rt.url, trust_env=False, auth=RuntimeAuth(rt), **kwargs)


def echo_body(service: str, **extra: object) -> dict[str, object]:
    """The FunctionDeployment faas-cli sends for stack.yml's echo, renamed to ``service``."""
    body = load_stack(STACK).functions["echo"].deployment()
    body["service"] = service
    body.update(extra)
    return body


def available(http: httpx.Client, name: str) -> int:
    r = http.get(f"/system/function/{name}")
    return int(r.json().get("availableReplicas", 0)) if r.status_code == 200 else -1


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """A runtime serving stack.yml's functions (ready wait 2s for quick 503s), with the
    function token secret and the random basic-auth credentials RuntimeProcess made."""
    state_dir = tmp_path_factory.mktemp("runtime")
    with serving(
        RuntimeProcess(stack=STACK, state_dir=state_dir, settings={"ready_wait": 2})
    ) as rt:
        yield rt


@pytest.fixture(scope="session")
def auth_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """A runtime with basic auth USER/PASSWORD chosen by writing its files first (with
    whitespace that must be trimmed)."""
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path_factory.mktemp("runtime-auth"))
    rt.auth_dir.mkdir(mode=0o700)
    (rt.auth_dir / "basic-auth-user").write_text(f"{USER}\n")
    (rt.auth_dir / "basic-auth-password").write_text(f"  {PASSWORD}\n")
    with serving(rt):
        yield rt


@pytest.fixture()
def http(runtime: RuntimeProcess) -> Iterator[httpx.Client]:
    """A client of ``runtime`` with :class:`RuntimeAuth`."""
    with client(runtime, timeout=60) as c:
        yield c
