"""The :class:`Workload` descriptor and the shared parameter models."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .data import Requirements, WorkloadData
from .errors import InvalidParams, WorkloadError

Policy = Literal["P1", "P2", "P3", "P4"]


class Params(BaseModel):
    """Base of every workload's parameters: unknown fields are an error, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RoundScope(Params):
    """One round's updates (P2): ``round`` and optionally a subset of its ``clients``."""

    round: int = Field(
        ge=1, description="training round (its clients trained from globals[round-1])"
    )
    clients: list[str] | None = Field(
        default=None,
        min_length=1,
        description="clients to include; all of the round's when omitted",
    )

    @field_validator("clients")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("client ids must be unique")
        return v


class RoundRange(Params):
    """A range of rounds (P3), ``first_round`` to ``last_round`` inclusive."""

    first_round: int = Field(ge=1, description="first round of the range")
    last_round: int = Field(ge=1, description="last round of the range (inclusive)")

    @model_validator(mode="after")
    def _range(self) -> Self:
        if self.last_round < self.first_round:
            raise ValueError(
                f"last_round ({self.last_round}) must be >= first_round ({self.first_round})"
            )
        return self

    @property
    def rounds(self) -> tuple[int, ...]:
        """The rounds of the range, in order."""
        return tuple(range(self.first_round, self.last_round + 1))

    def chosen(self, workload: str, asked: list[str] | None, took_part: list[str]) -> list[str]:
        """The clients ``asked`` for (all that ``took_part`` in the range when None), or
        :class:`InvalidParams` naming those of them that took no part."""
        clients = took_part if asked is None else list(asked)
        unknown = [c for c in clients if c not in took_part]
        if unknown:
            problem = f"did not take part in rounds {self.first_round}-{self.last_round}"
            raise invalid(workload, "clients", problem, unknown)
        return clients


class RoundParams(RoundScope):
    """A round's updates plus how to weight them into the aggregate."""

    weighting: Literal["samples", "uniform"] = Field(
        default="samples", description="aggregate weights: n_i / sum n (FedAvg) or uniform"
    )


P = TypeVar("P", bound=Params)


@dataclass(frozen=True)
class Workload(Generic[P]):
    """A registered non-training workload.

    Attributes
    ----------
    name : str
        Registry key (also the query's ``workload`` field).
    summary : str
        One line on what it computes.
    policy : str
        Default FLStore caching policy (P1-P4) for its access pattern.
    needs : str
        Human-readable statement of the data it reads.
    params_model : type
        Pydantic model of its parameters.
    """

    name: str
    summary: str
    policy: Policy
    needs: str
    params_model: type[P]
    _requirements: Callable[[P], Requirements]
    _run: Callable[[WorkloadData, P], dict[str, Any]]

    def parse(self, params: Mapping[str, Any] | P | None = None) -> P:
        """Validate raw parameters; raises :class:`InvalidParams` listing every problem."""
        if isinstance(params, self.params_model):
            return params
        try:
            return self.params_model.model_validate(dict(params or {}))
        except ValidationError as exc:
            errors = [
                {
                    "field": ".".join(str(p) for p in e["loc"]) or "(params)",
                    "problem": e["msg"],
                    "value": e.get("input"),
                }
                for e in exc.errors()
            ]
            raise InvalidParams(self.name, errors) from None
        except TypeError as exc:
            raise InvalidParams(self.name, [{"field": "(params)", "problem": str(exc)}]) from None

    def requirements(self, params: Mapping[str, Any] | P | None = None) -> Requirements:
        """What this query needs loaded (rounds, clients, globals, metadata, evaluator)."""
        return self._requirements(self.parse(params))

    def run(
        self, data: WorkloadData, params: Mapping[str, Any] | P | None = None
    ) -> dict[str, Any]:
        """Validate ``params`` and run on ``data``; returns a JSON-serialisable dict."""
        p = self.parse(params)
        try:
            result = self._run(data, p)
        except WorkloadError as exc:
            if hasattr(exc, "workload") and not getattr(exc, "workload", ""):
                exc.workload = self.name
            raise
        return {"workload": self.name, **result}

    def describe(self) -> dict[str, Any]:
        """Name, policy, data needs and the JSON schema of the parameters."""
        return {
            "name": self.name,
            "summary": self.summary,
            "policy": self.policy,
            "needs": self.needs,
            "params_schema": self.params_model.model_json_schema(),
        }


def invalid(workload: str, field: str, problem: str, value: Any = None) -> InvalidParams:
    """Shorthand for a one-problem :class:`InvalidParams` (parameters that do not fit the data)."""
    return InvalidParams(workload, [{"field": field, "problem": problem, "value": value}])


def round_requirements(params: RoundScope, *, evaluator: bool = False) -> Requirements:
    """Requirements of a one-round (P2) workload (metadata when weighting by sample counts)."""
    r = params.round
    weighting = getattr(params, "weighting", "uniform")
    return Requirements(
        policy="P2",
        update_rounds=(r,),
        clients=None if params.clients is None else tuple(params.clients),
        global_versions=(r - 1,),
        client_meta_rounds=(r,) if weighting == "samples" else (),
        evaluator=evaluator,
    )
