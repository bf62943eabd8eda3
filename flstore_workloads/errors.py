"""Errors of the workloads component: one base class, subclasses that carry the facts.

Only the HTTP layer (request tracker, cache function handler) turns these into status codes; each
error offers :meth:`WorkloadError.to_dict` with the ``{"error", "detail"}`` body the team uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class WorkloadError(Exception):
    """Base class of every error raised by :mod:`flstore_workloads`.

    Attributes
    ----------
    code : str
        Stable machine-readable error code (``"invalid_params"``, ...).
    detail : str
        What was wrong and how to fix it.
    """

    code = "workload_error"
    status = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        """JSON body ``{"error": code, "detail": detail}`` for an HTTP 4xx answer."""
        return {"error": self.code, "detail": self.detail}


class UnknownWorkload(WorkloadError):
    """The workload name is not in the registry."""

    code = "unknown_workload"
    status = 404

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown workload {name!r}; known workloads: {', '.join(self.known)}")


class InvalidParams(WorkloadError):
    """Parameters that fail validation, alone or against the data they are applied to.

    Attributes
    ----------
    workload : str
        Workload name.
    errors : list of dict
        One ``{"field", "problem", "value"}`` entry per problem.
    """

    code = "invalid_params"
    status = 422

    def __init__(self, workload: str, errors: Sequence[dict[str, Any]]) -> None:
        self.workload = workload
        self.errors = [dict(e) for e in errors]
        parts = [f"{e.get('field', '?')}: {e.get('problem', 'invalid')}" for e in self.errors]
        super().__init__(f"invalid parameters for workload {workload!r}: " + "; ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        """JSON body with the per-field problems added under ``"errors"``."""
        body = super().to_dict()
        body["errors"] = [{k: _jsonable(v) for k, v in e.items()} for e in self.errors]
        return body


class MissingData(WorkloadError):
    """The data container lacks something the workload needs (a round, client, global, metadata).

    Attributes
    ----------
    workload : str
        Workload name (empty when raised outside a workload).
    kind : str
        ``"updates"``, ``"update"``, ``"global"``, ``"client_meta"``, ``"round_meta"``,
        ``"evaluator"``.
    round : int or None
        Round (or global version) concerned.
    clients : tuple of str
        Clients concerned, if any.
    """

    code = "missing_data"
    status = 409

    def __init__(
        self,
        kind: str,
        *,
        round: int | None = None,
        clients: Sequence[str] = (),
        key: str | None = None,
        workload: str = "",
    ) -> None:
        self.kind = kind
        self.round = round
        self.clients = tuple(clients)
        self.key = key
        self.workload = workload
        what = kind
        if round is not None:
            what += f" of round {round}" if kind != "global" else f" version {round}"
        if self.clients:
            what += f" for clients {', '.join(self.clients)}"
        if key is not None:
            what += f" (field {key!r})"
        hint = {
            "global": "load the global model of that version (globals[r] is the model after round r;"
            " round r's clients trained from globals[r-1])",
            "evaluator": "plug an Evaluator (a validation set) into WorkloadData.evaluator",
        }.get(kind, "load it into the cache function before running the workload")
        super().__init__(f"missing {what}: {hint}")


class DataMismatch(WorkloadError):
    """The data is present but inconsistent (vector shapes, dtypes, non-finite values)."""

    code = "data_mismatch"
    status = 409


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)
