"""The cache engine's errors (one base; ``status`` and ``code`` go to the HTTP layer)."""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base error of the cache engine: a fact-carrying detail, an HTTP status and a code."""

    status, code = 500, "engine_error"

    def __init__(self, detail: str, **facts: Any) -> None:
        super().__init__(detail)
        self.detail, self.facts = detail, facts

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.facts}


class NoCapacity(EngineError):
    status, code = 507, "no_capacity"


class FunctionsUnavailable(NoCapacity):
    """No room for a query on the cache functions that answer, while some of the engine's
    functions do not answer now (restarted with the runtime, or still deploying): the query
    may fit once they are back, so it is asked again (503), not refused for good (507)."""

    status, code = 503, "functions_unavailable"


class LoadFailed(EngineError):
    status, code = 502, "load_failed"


class RoundMissing(EngineError):
    status, code = 404, "round_not_written"


class NoEvaluator(EngineError):
    status, code = 422, "no_evaluator"


def one_line(exc: BaseException) -> str:
    """An error as one log line (no traceback): its class and its first line."""
    text = str(getattr(exc, "detail", "") or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
