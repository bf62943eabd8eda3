"""The tracker's error: a query it could not serve, with the HTTP status and JSON body to send."""

from __future__ import annotations

from typing import Any


class TrackerError(Exception):
    """A query the tracker could not serve; ``status``/``body`` go to the HTTP layer."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail", ""))
        self.status, self.body = status, body
