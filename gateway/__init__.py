"""FedFaaS node gateway: HTTP ingest into shared memory, rounds, routing to aggregators.

Run one per node: ``python -m gateway --node NAME --port P --state-dir DIR --redis URL``
(settings: :class:`GatewaySettings`, env prefix ``FEDFAAS_GATEWAY_``).

HTTP API (errors are ``{"error": code, "detail": how to fix}``). Every route but ``/healthz``
needs a bearer credential (401 ``unauthorized`` without a good one): the admin secret, shared by
the node gateways, or where said a client token of the job. A client's token is
HMAC-SHA256(secret, ``"<job>/<salt>/<client>"``) with the job's salt, drawn at random when the
job is created and journaled with it: a job created again under the same name (or resumed)
has a new salt, and the tokens of the one before are refused.

- ``POST /v1/jobs?job=&rounds=&goal=&clients=c1,c2[&nodes=a,b]`` (admin bearer; body: initial
  weights as safetensors) -> 201 ``{job, round, version, spec, tokens, salt, id, plan}``:
  ``tokens`` (client -> its bearer token) is the one place clients' tokens come from.
- ``POST /v1/jobs/{job}/rounds/{round}/updates`` (client bearer, ``X-Client-Id``,
  ``X-Sample-Count``, ``Content-Length``; body: safetensors) -> 202 ``{key, round, client}``
  once sealed in shared memory and journaled. 400 ``malformed_safetensors`` /
  ``spec_mismatch`` / ``size_mismatch`` / ``truncated_body`` / ``bad_sample_count``,
  401 ``unauthorized`` (also for a job this node does not have), 403 ``client_revoked``,
  409 ``stale_round`` /
  ``future_round`` / ``round_not_open`` (the next round, on a node that has not followed the
  root's publication yet: the SDK sends again) /
  ``duplicate_client`` / ``round_full`` / ``wrong_node`` / ``job_finished``, 411
  ``length_required``, 413 ``body_too_large`` / ``header_too_large``, 422 ``non_finite``.
- ``GET /v1/jobs/{job}/model`` (a client of the job or admin bearer) -> safetensors,
  ``ETag: "v<n>"``, ``X-Model-Version``; 304 on ``If-None-Match``; 503 ``unavailable``
  with ``Retry-After`` on a non-root node that has not fetched its version from the root yet
  (the SDK asks again; ``tests/dataplane/test_model_version_gap.py``).
- ``GET /v1/jobs/{job}`` progress (a client of the job or admin bearer; the admin also reads
  ``salt``, ``revoked`` and ``store``; without a credential an unknown job answers 401 too); ``GET /v1/jobs`` (admin); ``DELETE /v1/jobs/{job}``
  (admin); ``GET /healthz`` (open); ``GET /metrics`` (Prometheus, admin bearer: a scrape
  sends the admin secret from a file, ``authorization: {credentials_file: ...}``);
  ``GET /v1/router`` (admin).
- ``DELETE /v1/jobs/{job}/clients/{id}[?force=true]`` (admin) -> 200 ``{job, client, revoked,
  short_nodes}``: revoke one client; idempotent; 404 ``unknown_job`` / ``unknown_client``.
  Recorded in the journal: this node refuses the client's uploads and model reads (403
  ``client_revoked``) at once, the job's other nodes from their next journal read (every
  ~0.2 s); an update accepted before still counts. The rounds still need their goals from the
  clients left: 409 ``too_few_clients`` (nothing revoked) when a node's plan would need more
  updates than clients are left to it, unless ``force=true`` (the round then ends only when
  closed: ``POST .../close``, which the control plane does at the round's deadline).
- ``POST /v1/internal/jobs/{job}/rounds/{r}/partials?slot=S`` (admin bearer; body: the raw
  store object): a partial from another node's gateway. 409 ``stale_round`` (the round is not
  open here), ``unknown_slot`` (S is no slot of another node in the round's plan here), 404
  ``unknown_job``; the sender then asks the journal what happened (:mod:`gateway.forward`).
- ``PUT /v1/jobs/{job}/rounds/{r}/plan`` (admin bearer; body: the slot table of
  :meth:`Plan.to_json` plus ``version``): the control plane's plan for the open round (applied
  in place: updates already routed to a slot stay there) or the next one (kept until it opens).
  422 ``bad_plan`` (unknown node or client, goals not adding up, cycle, top not on the job's
  root node), 409 ``plan_conflict`` (it would drop or move updates the round holds) /
  ``stale_round`` / ``future_round``, 401.
- ``POST /v1/jobs/{job}/adopt`` (admin bearer; body ``{"from": "<node>"}``): take the job
  over from its dead root node (:mod:`gateway.takeover`) -> 200 ``{job, root, version, round,
  resend}``, ``resend`` being the clients whose updates of the open round were lost with it.
  422 ``bad_adopt``, 409 ``not_root`` (that node is not the root any more, or this one is) /
  ``model_lost`` (the published model is neither here nor in MinIO), 503
  ``checkpoints_unavailable``.
- ``POST /v1/jobs/{job}/rounds/{r}/close`` (admin bearer; optional body
  ``{"received": {node: n}}``): stop the round's intake here (later uploads: 409
  ``round_closed``); with the counts (nodes left out count 0, e.g. a dead one), or when the
  round takes updates on this node only, lower the goals to what arrived so the round
  aggregates exactly those. 409 ``plan_conflict`` when this node's count differs.
- Over TLS (with a CA, ``tls_client_certs`` not ``none``), the routes only the platform's parts
  call (partials, plan, close, adopt, unmask, ``DELETE`` of a job or of a client; the map is in
  :mod:`gateway.callers`) also need a client certificate the CA signed on the connection
  (``tls_internal_names``: one naming a part listed): 403 ``client_certificate_required``
  otherwise, whatever the bearer token, answered before the body is read.
- Request bodies: none is read before its request is authenticated and routed (a refusal is
  answered from the head alone, even with ``Expect: 100-continue``); JSON bodies are bounded
  by ``max_json_body`` (413 ``body_too_large``); the initial weights stream into shared memory;
  bodies in flight share the node's ``max_inflight_bytes`` budget: past it, 503
  ``memory_budget`` with ``Retry-After`` and nothing allocated.
- ``GET /v1/jobs/{job}`` also reports ``dropped``: ``{updates, recent}``, the acknowledged
  updates of this node that no published model holds (a partial the root refused for good, a
  round the root published without them), each loss with its round, slot, clients and reason
  (also ``fedfaas_gateway_updates_dropped_total{reason}`` in ``/metrics``).
- ``GET /v1/jobs/{job}`` also reports the load: ``queue`` (= k * E, or the pending updates
  before any aggregator finished a task), ``k`` (updates/s), ``E_s`` (mean aggregator task
  time from the router metrics), ``pending``, ``plan_version``, ``pushed_plan``.
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
