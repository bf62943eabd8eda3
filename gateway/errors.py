"""Gateway errors. Each carries an HTTP status and a stable code; only the HTTP layer maps them."""

from __future__ import annotations


class GatewayError(Exception):
    """Base of gateway errors: ``status``, ``code`` and a ``detail`` saying how to fix it."""

    status = 400
    code = "bad_request"

    def __init__(self, detail: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def body(self) -> dict[str, str]:
        return {"error": self.code, "detail": self.detail}

    def headers(self) -> list[tuple[str, str]]:
        """Extra response headers (lower-case names)."""
        return []


class Unauthorized(GatewayError):
    status = 401
    code = "unauthorized"


class Overloaded(GatewayError):
    """The node cannot take the request now (its memory budget is spent): retry later."""

    status = 503
    code = "memory_budget"

    def __init__(self, detail: str, *, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after

    def headers(self) -> list[tuple[str, str]]:
        return [("retry-after", str(self.retry_after))]


class JobNotFound(GatewayError):
    status = 404
    code = "unknown_job"


class JobExists(GatewayError):
    status = 409
    code = "job_exists"


class UpdateRejected(GatewayError):
    """An upload refused; ``client_id`` and ``round`` say whose and which; ``retry_after``
    (seconds, a 503's ``Retry-After``): nothing is wrong with it, send it again then."""

    def __init__(
        self,
        detail: str,
        *,
        status: int = 400,
        code: str = "bad_update",
        client_id: str | None = None,
        round: int | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(detail, status=status, code=code)
        self.client_id = client_id
        self.round = round
        self.retry_after = retry_after

    def headers(self) -> list[tuple[str, str]]:
        return [] if self.retry_after is None else [("retry-after", str(self.retry_after))]


class RetryLater(UpdateRejected):
    """503 + ``Retry-After``: the node cannot take the upload now and keeps nothing of it; the
    client sends it again after ``retry_after`` seconds. Subclasses name the ``code``."""

    def __init__(
        self,
        detail: str,
        *,
        retry_after: int,
        client_id: str | None = None,
        round: int | None = None,
    ) -> None:
        super().__init__(
            f"{detail}; retry after {retry_after} s",
            status=503,
            code=self.code,
            client_id=client_id,
            round=round,
            retry_after=retry_after,
        )


class StoreUnavailable(RetryLater):
    """503 + ``Retry-After``: this node's store cannot take one more object now (it holds its
    most objects, or the system refused the memory or a file: ``/dev/shm`` full, out of file
    descriptors). Nothing is held for the request; the client retries later."""

    code = "store_full"


class NotFound(GatewayError):
    status = 404
    code = "not_found"
