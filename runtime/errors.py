"""Errors of the embedded runtime; the HTTP layer maps each to a status code."""

from __future__ import annotations

from typing import ClassVar


class FaasRuntimeError(Exception):
    """Base class of every runtime error. ``status`` is the HTTP code, ``code`` a stable slug."""

    status = 500
    code = "internal"
    #: headers the answer carries (a 401 says which scheme it wants)
    headers: dict[str, str] = {}

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidRequest(FaasRuntimeError):
    """The request body or a parameter is malformed (bad JSON, wrong types)."""

    status = 400
    code = "invalid_request"


class InvalidDeployment(FaasRuntimeError):
    """A FunctionDeployment failed validation (name, image, labels, limits)."""

    status = 400
    code = "invalid_deployment"

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(detail)
        self.service = service


class UnsupportedImage(InvalidDeployment):
    """The image does not map to a function folder this runtime can run."""

    code = "unsupported_image"


class WrongNamespace(FaasRuntimeError):
    """Only the function namespace (``openfaas-fn``) exists on this runtime."""

    status = 400
    code = "wrong_namespace"

    def __init__(self, namespace: str, expected: str) -> None:
        super().__init__(f"namespace must be: {expected} (got {namespace!r})")
        self.namespace = namespace
        self.expected = expected


class NamedError(FaasRuntimeError):
    """An error about one function or secret, ``name``: its detail is :attr:`MESSAGE` with the
    name filled in."""

    MESSAGE: ClassVar[str] = "{name!r}"

    def __init__(self, name: str) -> None:
        super().__init__(self.MESSAGE.format(name=name))
        self.name = name


class FunctionNotFound(NamedError):
    """No function of that name is deployed."""

    status = 404
    code = "not_found"
    MESSAGE = "function {name!r} not found; deploy it first (POST /system/functions)"


class FunctionExists(NamedError):
    """POST for a function that is already deployed (faas-cli PUTs first, so it never hits this)."""

    status = 409
    code = "exists"
    MESSAGE = "function {name!r} already exists; update it with PUT /system/functions"


class InvalidScale(FaasRuntimeError):
    """A scale request the runtime refuses (for example 0 replicas)."""

    status = 400
    code = "invalid_scale"

    def __init__(self, name: str, replicas: int, detail: str) -> None:
        super().__init__(detail)
        self.name = name
        self.replicas = replicas


class TooManyFunctions(FaasRuntimeError):
    """The CE limit on the number of functions (only with ``ce_limits`` on)."""

    status = 400
    code = "too_many_functions"


class SecretNotFound(NamedError):
    """No secret of that name exists."""

    status = 404
    code = "secret_not_found"
    MESSAGE = "secret {name!r} not found; create it first (POST /system/secrets)"


class SecretExists(NamedError):
    """POST for a secret that already exists."""

    status = 409
    code = "secret_exists"
    MESSAGE = "secret {name!r} already exists; update it with PUT /system/secrets"


class SecretInUse(FaasRuntimeError):
    """DELETE of a secret that deployed functions still list (faas-netes would delete it and
    leave those functions unable to start new replicas)."""

    status = 409
    code = "secret_in_use"

    def __init__(self, name: str, functions: list[str]) -> None:
        super().__init__(
            f"secret {name!r} is used by {', '.join(functions)}; remove those functions or "
            "redeploy them without it first"
        )
        self.name = name
        self.functions = functions


class Unauthorized(FaasRuntimeError):
    """Missing or wrong credentials on a ``/system/*`` route.

    401 with ``WWW-Authenticate: Basic realm="Restricted"`` as OpenFaaS answers (clients such as
    faas-cli act on the status); the body is the JSON error, ``detail`` OpenFaaS's text.
    """

    status = 401
    code = "unauthorized"

    def __init__(self) -> None:
        super().__init__("invalid credentials")


class PayloadTooLarge(FaasRuntimeError):
    """An asynchronous call's body is larger than ``async_max_body``."""

    status = 413
    code = "payload_too_large"


class AsyncNotConfigured(FaasRuntimeError):
    """``/async-function/*`` on a runtime started without ``--redis-url``."""

    status = 501
    code = "not_implemented"

    def __init__(self) -> None:
        super().__init__(
            "asynchronous invocations need --redis-url and --redis-credentials-file "
            "(the durable queue lives in Redis)"
        )


class QueueUnavailable(FaasRuntimeError):
    """The Redis that holds asynchronous calls cannot be reached; the call was not accepted."""

    status = 503
    code = "queue_unavailable"


class FunctionUnauthorized(FaasRuntimeError):
    """An asynchronous call without the function token its function requires."""

    status = 401
    code = "unauthorized"
    headers = {"WWW-Authenticate": "Bearer"}  # as the function itself answers
