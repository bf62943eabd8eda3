"""Request bodies of the OpenFaaS provider API (faas-provider/types), as pydantic models."""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.errors import InvalidRequest


class FunctionResources(BaseModel):
    """``limits`` / ``requests``: Kubernetes quantities as strings."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    memory: str | None = None
    cpu: str | None = None
    nvidia_gpu: str | None = Field(default=None, alias="nvidia.com/gpu")
    amd_gpu: str | None = Field(default=None, alias="amd.com/gpu")
    intel_gpu: str | None = Field(default=None, alias="intel.com/gpu")

    def dump(self) -> dict[str, str]:
        return self.model_dump(by_alias=True, exclude_none=True)


class FunctionDeployment(BaseModel):
    """Body of POST/PUT ``/system/functions``. ``registryAuth`` and ``network`` are ignored."""

    model_config = ConfigDict(extra="ignore")

    service: str
    image: str = ""
    namespace: str = ""
    envProcess: str = ""
    envVars: dict[str, str] | None = None
    constraints: list[str] | None = None
    secrets: list[str] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    limits: FunctionResources | None = None
    requests: FunctionResources | None = None
    readOnlyRootFilesystem: bool = False


class ScaleServiceRequest(BaseModel):
    """Body of POST ``/system/scale-function/{name}``; a missing ``replicas`` reads as 0."""

    model_config = ConfigDict(extra="ignore")

    serviceName: str = ""
    replicas: int = 0
    namespace: str = ""


class DeleteFunctionRequest(BaseModel):
    """Body of DELETE ``/system/functions``."""

    model_config = ConfigDict(extra="ignore")

    functionName: str = ""
    namespace: str = ""


class Secret(BaseModel):
    """Body of POST/PUT/DELETE ``/system/secrets`` (faas-provider ``types.Secret``): ``rawValue``
    is base64 (Go's ``[]byte``) and wins over ``value`` when both are set, as in faas-netes."""

    model_config = ConfigDict(extra="ignore")

    name: str = ""
    namespace: str = ""
    value: str = ""
    rawValue: str = ""

    def data(self) -> bytes:
        """The secret's bytes; :class:`InvalidRequest` when there are none or bad base64."""
        if self.rawValue:
            try:
                raw = base64.b64decode(self.rawValue, validate=True)
            except binascii.Error:
                raise InvalidRequest("rawValue must be base64 (Go []byte)") from None
        else:
            raw = self.value.encode()
        if not raw:
            raise InvalidRequest(f"secret {self.name!r} needs a non-empty value or rawValue")
        return raw


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes) -> M:
    """Parse a JSON body into ``model`` or raise :class:`InvalidRequest` saying what was wrong."""
    if not raw.strip():
        raise InvalidRequest(f"empty body: send a JSON {model.__name__}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"bad {model.__name__} JSON: {problems}") from None


def omit_empty(d: dict[str, Any]) -> dict[str, Any]:
    """Drop ``None``, ``0``, ``False``, empty strings/lists/maps (Go's ``omitempty``)."""
    return {k: v for k, v in d.items() if v not in (None, 0, False, "", [], {})}
