"""The one client of the OpenFaaS gateway API, synchronous (:class:`OpenFaaS`) and asynchronous
(:class:`AsyncOpenFaaS`), for a real OpenFaaS gateway and the embedded runtime alike.

``fedfaas deploy`` (what faas-cli sends), ``fedfaas up``, the FLStore cache engine (its cache
functions) and the control plane (scaling ``aggregator``) all use it. Both classes send the same
requests (:class:`Call`, built once below) and read the answers the same way; they differ only
in how they wait.

A read (``GET``) or a scale to a set number of replicas is asked again when it fails for a
reason that may pass, a 5xx or no answer (:func:`transient`): three tries over about 1.5 s
(:data:`RETRY_DELAYS_S`); the last error says how many tries were made. faas-netes answers 500
"unable to update function deployment" when its Deployment write meets another writer's (seen
in CI). A 4xx, a deploy, a removal or a secret goes up at once; an invocation is never sent
twice.

``/system/*`` takes HTTP basic auth (credentials are files: :func:`read_basic_auth`); without
credentials an empty Bearer token is sent, as faas-cli does. ``/function/<name>`` never gets the
gateway's credentials: only the ``Authorization`` header the caller passes to ``invoke``, which
for FedFaaS functions is ``Bearer <function token>`` (the secret :data:`FUNCTION_TOKEN_SECRET`
every function is deployed with and checks; :mod:`runtime.function_auth`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

log = logging.getLogger(__name__)

try:
    from importlib.metadata import version as _pkg_version

    _VERSION = _pkg_version("fedfaas")
except Exception:  # running from a source tree
    _VERSION = "0.0.0"

USER_AGENT = f"fedfaas-cli/{_VERSION} (faas-cli compatible)"
T = TypeVar("T")

#: seconds between the tries of a call that may be sent again (:attr:`Call.retry`) and failed
#: transiently: three tries over about 1.5 s
RETRY_DELAYS_S = (0.5, 1.0)


class OpenFaaSError(RuntimeError):
    """The gateway refused a call (``status``: its HTTP status) or could not be reached (0;
    ``timed_out`` when it, or the function, did not answer in time)."""

    def __init__(self, detail: str, status: int = 0, *, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.timed_out = timed_out


def transient(exc: OpenFaaSError) -> bool:
    """Whether asking again may succeed: a 5xx or no answer (``status`` 0), not a 4xx."""
    return exc.status == 0 or exc.status >= 500


@dataclass(frozen=True)
class FunctionStatus:
    """``GET /system/function/{name}``: the function as the gateway reports it."""

    name: str
    replicas: int
    available_replicas: int
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any, name: str) -> FunctionStatus:
        if not isinstance(data, dict):
            raise OpenFaaSError(f"GET /system/function/{name}: not a JSON object")
        try:
            return cls(
                name=str(data.get("name", name)),
                replicas=int(data.get("replicas") or 0),
                available_replicas=int(data.get("availableReplicas") or 0),
                labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
                raw=data,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise OpenFaaSError(f"GET /system/function/{name}: unreadable answer: {exc}") from exc

    def scale_bounds(self, max_default: int = 20) -> tuple[int, int]:
        """``(min, max)`` from ``com.openfaas.scale.min`` / ``.max`` (defaults 1 and 20)."""

        def num(key: str, default: int) -> int:
            try:
                return int(self.labels.get(key, default))
            except (TypeError, ValueError):
                return default

        return num("com.openfaas.scale.min", 1), num("com.openfaas.scale.max", max_default)


@dataclass(frozen=True)
class DeployResult:
    """One function's deployment as faas-cli reports it (the last request's answer)."""

    function: str
    status: int
    method: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status in (200, 202)


#: The OpenFaaS secret every FedFaaS function is deployed with and checks callers against.
FUNCTION_TOKEN_SECRET = "fedfaas-function-token"

#: The annotation that names a function's handler folder on the embedded runtime (in place of
#: an image it can pull; ``runtime.images``).
HANDLER_ANNOTATION = "com.fedfaas.handler"


def function_deployment(
    name: str,
    image: str,
    *,
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    handler_dir: str | Path | None = None,
    secrets: list[str] | None = None,
) -> dict[str, Any]:
    """A FunctionDeployment body for :meth:`OpenFaaS.deploy` (``handler_dir``: the embedded
    runtime's stand-in for the image; ``secrets``: OpenFaaS secrets the function gets as files)."""
    body: dict[str, Any] = {
        "service": name,
        "image": image,
        "envVars": dict(env or {}),
        "labels": dict(labels or {}),
        "annotations": {},
    }
    if secrets:
        body["secrets"] = list(secrets)
    if handler_dir is not None:
        body["annotations"][HANDLER_ANNOTATION] = str(Path(handler_dir).resolve())
    return body


def read_basic_auth(auth_dir: str | Path) -> tuple[str, str]:
    """``basic-auth-user`` and ``basic-auth-password`` of a folder (whitespace trimmed).

    Raises
    ------
    OpenFaaSError
        A file is missing or unreadable.
    """
    d = Path(auth_dir)
    try:
        return (
            (d / "basic-auth-user").read_text().strip(),
            (d / "basic-auth-password").read_text().strip(),
        )
    except OSError as exc:
        raise OpenFaaSError(f"cannot read basic-auth files in {d}: {exc}") from exc


def auth_header(auth: tuple[str, str] | None) -> str:
    """``Basic base64(user:pass)`` or the empty Bearer token faas-cli sends without credentials."""
    if auth is None:
        return "Bearer"
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    return f"Basic {token}"


# --- the requests, built once for both clients ---------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its answer is read; ``retry``: sending it again changes nothing
    (a read, a scale to a set number), so a transient failure is tried again."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, str] | None = None
    json: Any = None
    retry: bool = False


def _fail(r: httpx.Response, what: str) -> OpenFaaSError:
    return OpenFaaSError(f"{what} answered {r.status_code}: {r.text[:300]!r}", r.status_code)


def _ns(namespace: str, **more: str) -> dict[str, str] | None:
    params = {"namespace": namespace, **more} if namespace else dict(more)
    return params or None


def _unreachable(method: str, name: str, path: str, exc: httpx.HTTPError) -> OpenFaaSError:
    timed_out = isinstance(exc, httpx.TimeoutException)
    return OpenFaaSError(f"{method} /function/{name}{path}: {exc!r}", timed_out=timed_out)


def _list(namespace: str) -> Call[list[dict[str, Any]]]:
    def read(r: httpx.Response) -> list[dict[str, Any]]:
        if r.status_code != 200:
            raise _fail(r, "GET /system/functions")
        return list(r.json())

    return Call("GET", "/system/functions", read, _ns(namespace), retry=True)


def _function(name: str, namespace: str) -> Call[FunctionStatus | None]:
    def read(r: httpx.Response) -> FunctionStatus | None:
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise _fail(r, f"GET /system/function/{name}")
        return FunctionStatus.from_json(r.json(), name)

    return Call("GET", f"/system/function/{name}", read, _ns(namespace, usage="1"), retry=True)


def _scale(name: str, replicas: int, namespace: str) -> Call[None]:
    def read(r: httpx.Response) -> None:
        if r.status_code >= 300:
            raise _fail(r, f"POST /system/scale-function/{name}")
        log.info("scaled %s to %d replicas (HTTP %d)", name, replicas, r.status_code)

    body = {"serviceName": name, "replicas": int(replicas), "namespace": namespace}  # as faas-cli
    return Call("POST", f"/system/scale-function/{name}", read, json=body, retry=True)


def _remove(name: str, namespace: str) -> Call[bool]:
    def read(r: httpx.Response) -> bool:
        if r.status_code == 404:
            return False
        if r.status_code not in (200, 202):
            raise _fail(r, f"DELETE /system/functions ({name})")
        return True

    body = {"functionName": name, "namespace": namespace}  # as faas-cli sends it
    return Call("DELETE", "/system/functions", read, json=body)


def _logs(name: str, tail: int | None, namespace: str) -> Call[list[dict[str, Any]]]:
    def read(r: httpx.Response) -> list[dict[str, Any]]:
        if r.status_code != 200:
            raise _fail(r, "GET /system/logs")
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    params = {"name": name, "follow": "false", **({"tail": str(tail)} if tail is not None else {})}
    return Call("GET", "/system/logs", read, _ns(namespace, **params), retry=True)


def _deploy(body: dict[str, Any], method: str) -> Call[DeployResult]:
    name = str(body["service"])
    return Call(
        method,
        "/system/functions",
        lambda r: DeployResult(name, r.status_code, method, r.text),
        json=body,
    )


def _set_secret(name: str, value: str, method: str, namespace: str) -> Call[int]:
    def read(r: httpx.Response) -> int:
        if r.status_code not in (200, 201, 202, 404, 409):
            raise _fail(r, f"{method} /system/secrets ({name})")
        return r.status_code

    body = {"name": name, "value": value, **({"namespace": namespace} if namespace else {})}
    return Call(method, "/system/secrets", read, json=body)


def _healthz() -> Call[bool]:
    return Call("GET", "/healthz", lambda r: r.status_code == 200)


class _Client:
    def __init__(
        self,
        url: str,
        auth: tuple[str, str] | None,
        namespace: str,
        timeout: float,
        retry_delays_s: tuple[float, ...],
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.namespace = namespace
        self.retry_delays_s = retry_delays_s
        self._options: dict[str, Any] = {
            "base_url": self.url,
            "timeout": timeout,
            "trust_env": False,
            "verify": verify,
            "headers": {"User-Agent": USER_AGENT, "Authorization": auth_header(auth)},
        }

    def _function_request(
        self,
        http: httpx.Client | httpx.AsyncClient,
        name: str,
        method: str,
        path: str,
        content: bytes | Iterable[bytes] | None,
        json_body: Any,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> httpx.Request:
        req = http.build_request(
            method,
            f"/function/{name}{path}",
            content=content,
            json=json_body,
            headers=headers,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        if not any(k.lower() == "authorization" for k in headers or {}):
            req.headers.pop("Authorization", None)  # functions take no gateway credentials
        return req

    def _error(self, call: Call[Any], exc: httpx.HTTPError) -> OpenFaaSError:
        return OpenFaaSError(
            f"{call.method} {self.url}{call.path}: cannot reach: {exc!r}",
            timed_out=isinstance(exc, httpx.TimeoutException),
        )

    def _delays(self, call: Call[Any]) -> tuple[float, ...]:
        return self.retry_delays_s if call.retry else ()

    def _again(self, call: Call[Any], exc: OpenFaaSError, tries: int, delays: int) -> bool:
        """Whether ``call``, failed with ``exc`` on its ``tries``-th try, is sent again; on the
        last try of a transient failure the error says how many tries were made."""
        if not transient(exc) or not call.retry:
            return False
        if tries > delays:
            if tries > 1:
                exc.detail = f"{exc.detail} ({tries} tries)"
                exc.args = (exc.detail,)
            return False
        log.info("%s %s failed (%s); asked again", call.method, call.path, exc.detail)
        return True


class OpenFaaS(_Client):
    """Synchronous client (``fedfaas deploy``, ``fedfaas up``, the cache engine).

    Parameters
    ----------
    url : gateway URL, e.g. ``http://127.0.0.1:8080``.
    auth : ``(user, password)`` for ``/system/*`` (see :func:`read_basic_auth`), or None.
    namespace : function namespace sent with each call (empty: the provider's default).
    timeout : seconds per request (an invocation can pass its own).
    max_connections : connection pool size (concurrent invocations).
    transport : an httpx transport (tests of request shapes only).
    retry_delays_s : seconds before each new try of a call that may be sent again.
    """

    def __init__(
        self,
        url: str,
        auth: tuple[str, str] | None = None,
        *,
        namespace: str = "",
        timeout: float = 60.0,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        super().__init__(url, auth, namespace, timeout, retry_delays_s, verify)
        self._http = httpx.Client(
            **self._options,
            limits=httpx.Limits(max_connections=max_connections),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenFaaS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _do(self, call: Call[T]) -> T:
        delays = self._delays(call)
        for tries in range(1, len(delays) + 2):
            try:
                return self._once(call)
            except OpenFaaSError as exc:
                if not self._again(call, exc, tries, len(delays)):
                    raise
                time.sleep(delays[tries - 1])
        raise AssertionError("unreachable")  # the last try returns or raises

    def _once(self, call: Call[T]) -> T:
        try:
            r = self._http.request(call.method, call.path, params=call.params, json=call.json)
        except httpx.HTTPError as exc:
            raise self._error(call, exc) from exc
        return call.read(r)

    def deploy(
        self, body: dict[str, Any], *, replace: bool = False, update: bool = True
    ) -> DeployResult:
        """Deploy one FunctionDeployment as faas-cli does: [DELETE,] PUT, then POST on 404.

        Never raises on a refusal: the result says what the gateway answered.
        """
        name = str(body["service"])
        if replace:
            self.remove(name)
        res = self._do(_deploy(body, "PUT" if update else "POST"))
        if update and res.status == 404:
            res = self._do(_deploy(body, "POST"))
        if res.status == 401:
            log.error("%s: unauthorized; give credentials (faas-cli login)", name)
        log.info("deploy %s: %s %d", name, res.method, res.status)
        return res

    def list_functions(self) -> list[dict[str, Any]]:
        return self._do(_list(self.namespace))

    def function(self, name: str) -> FunctionStatus | None:
        """The function's status, or None when it does not exist."""
        return self._do(_function(name, self.namespace))

    def scale(self, name: str, replicas: int) -> None:
        """Ask for ``replicas`` replicas (the gateway may refuse 0: :class:`OpenFaaSError`)."""
        self._do(_scale(name, replicas, self.namespace))

    def remove(self, name: str) -> bool:
        """Remove the function; False when it did not exist."""
        return self._do(_remove(name, self.namespace))

    def logs(self, name: str, tail: int | None = None) -> list[dict[str, Any]]:
        return self._do(_logs(name, tail, self.namespace))

    def healthz(self) -> bool:
        try:
            return self._do(_healthz())
        except OpenFaaSError:
            return False

    def set_secret(self, name: str, value: str) -> None:
        """Create secret ``name`` or, when it exists, replace its value (as ``faas-cli secret
        create`` then ``update``).

        Raises
        ------
        OpenFaaSError
            The gateway refused it (bad name, no credentials, no secrets API).
        """
        status = self._do(_set_secret(name, value, "POST", self.namespace))
        if status == 409:
            status = self._do(_set_secret(name, value, "PUT", self.namespace))
        if status not in (200, 201, 202):
            raise OpenFaaSError(f"secret {name}: the gateway answered {status}", status)
        log.info("secret %s set", name)

    def invoke(
        self,
        name: str,
        body: bytes | Iterable[bytes] | None = None,
        *,
        method: str = "POST",
        path: str = "",
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Call ``/function/<name>[path]`` and return its answer as it is.

        Raises
        ------
        OpenFaaSError
            The gateway could not be reached.
        """
        req = self._function_request(self._http, name, method, path, body, json, headers, timeout)
        try:
            return self._http.send(req)
        except httpx.HTTPError as exc:
            raise _unreachable(method, name, path, exc) from exc


class AsyncOpenFaaS(_Client):
    """Asynchronous client (the control plane); the same calls as :class:`OpenFaaS` but
    ``deploy`` (deploying is the command line's and the cache engine's)."""

    def __init__(
        self,
        url: str,
        auth: tuple[str, str] | None = None,
        *,
        namespace: str = "",
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        super().__init__(url, auth, namespace, timeout, retry_delays_s, verify)
        self._http = httpx.AsyncClient(**self._options, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncOpenFaaS:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _do(self, call: Call[T]) -> T:
        delays = self._delays(call)
        for tries in range(1, len(delays) + 2):
            try:
                return await self._once(call)
            except OpenFaaSError as exc:
                if not self._again(call, exc, tries, len(delays)):
                    raise
                await asyncio.sleep(delays[tries - 1])
        raise AssertionError("unreachable")  # the last try returns or raises

    async def _once(self, call: Call[T]) -> T:
        try:
            r = await self._http.request(call.method, call.path, params=call.params, json=call.json)
        except httpx.HTTPError as exc:
            raise self._error(call, exc) from exc
        return call.read(r)

    async def list_functions(self) -> list[dict[str, Any]]:
        return await self._do(_list(self.namespace))

    async def function(self, name: str) -> FunctionStatus | None:
        return await self._do(_function(name, self.namespace))

    async def scale(self, name: str, replicas: int) -> None:
        await self._do(_scale(name, replicas, self.namespace))

    async def remove(self, name: str) -> bool:
        return await self._do(_remove(name, self.namespace))

    async def logs(self, name: str, tail: int | None = None) -> list[dict[str, Any]]:
        return await self._do(_logs(name, tail, self.namespace))

    async def healthz(self) -> bool:
        try:
            return await self._do(_healthz())
        except OpenFaaSError:
            return False

    async def invoke(
        self,
        name: str,
        body: bytes | Iterable[bytes] | None = None,
        *,
        method: str = "POST",
        path: str = "",
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        req = self._function_request(self._http, name, method, path, body, json, headers, timeout)
        try:
            return await self._http.send(req)
        except httpx.HTTPError as exc:
            raise _unreachable(method, name, path, exc) from exc
