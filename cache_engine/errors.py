"""The cache engine's one error base; ``status`` and ``code`` go to the HTTP layer."""

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
