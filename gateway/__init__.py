"""FedFaaS node gateway: HTTP ingest into shared memory, rounds, routing to aggregators.

Run one per node: ``python -m gateway --node NAME --port P --state-dir DIR --redis URL``
(settings: :class:`GatewaySettings`, env prefix ``FEDFAAS_GATEWAY_``).

HTTP API (errors are ``{"error": code, "detail": how to fix}``):

- ``POST /v1/jobs?job=&rounds=&goal=&clients=c1,c2[&nodes=a,b]`` (admin bearer; body: initial
  weights as safetensors) -> 201 ``{job, round, version, spec, tokens, id, plan}``.
- ``POST /v1/jobs/{job}/rounds/{round}/updates`` (client bearer, ``X-Client-Id``,
  ``X-Sample-Count``, ``Content-Length``; body: safetensors) -> 202 ``{key, round, client}``
  once sealed in shared memory and journaled. 400 ``malformed_safetensors`` /
  ``spec_mismatch`` / ``size_mismatch`` / ``truncated_body`` / ``bad_sample_count``,
  401 ``unauthorized``, 404 ``unknown_job``, 409 ``stale_round`` / ``future_round`` /
  ``duplicate_client`` / ``round_full`` / ``wrong_node`` / ``job_finished``, 411
  ``length_required``, 413 ``body_too_large`` / ``header_too_large``, 422 ``non_finite``.
- ``GET /v1/jobs/{job}/model`` (client or admin bearer) -> safetensors, ``ETag: "v<n>"``,
  ``X-Model-Version``; 304 on ``If-None-Match``.
- ``GET /v1/jobs/{job}`` progress; ``GET /v1/jobs``; ``DELETE /v1/jobs/{job}`` (admin);
  ``GET /healthz``; ``GET /metrics`` (Prometheus).
- ``POST /v1/internal/jobs/{job}/rounds/{r}/partials?slot=S`` (admin bearer; body: the raw
  store object): a partial from another node's gateway.
"""

from gateway.core import Gateway
from gateway.errors import GatewayError, JobNotFound, Unauthorized, UpdateRejected
from gateway.jobs import Job
from gateway.plan import Plan, Planner, Slot, static_plan
from gateway.settings import GatewaySettings

__all__ = [
    "Gateway",
    "GatewayError",
    "GatewaySettings",
    "Job",
    "JobNotFound",
    "Plan",
    "Planner",
    "Slot",
    "Unauthorized",
    "UpdateRejected",
    "static_plan",
]
