"""FL client SDK: the names a practitioner uses, in one place::

    job = submit_job(control_plane_url, "digits", weights, rounds=5, goal=10, admin_token=secret)
    tokens = job.enroll(client_ids)
    with job.client("client-000", round=1) as fl:   # its node gateway, its own token
        model = fl.wait_for_version(0)
        fl.upload(1, state_dict, num_samples=120)
    job.wait()
    final = job.model()

A job is created on the control plane (:func:`submit_job`, whose answer is the job's handle,
:class:`Job`), which places each client on a node gateway. Each client's bearer token comes
from the job's enrollment (:meth:`Job.enroll`, or ``job["tokens"]`` for the clients enrolled
at creation): it depends on a salt drawn for that job, so it is good for that job only, and
not for a job created later under the same name.

Every call raises a :class:`ClientError` subclass naming the HTTP status, the server's error
code and its detail (:mod:`client.errors`); one class per code the platform answers.

The modules behind these names: :mod:`client.node` (the node gateway: :class:`FLClient`),
:mod:`client.control` (the control plane's calls), :mod:`client.submit` and
:mod:`client.job` (the job's handle), :mod:`client.flstore` (FLStore's queries).
"""

from __future__ import annotations

from client.control import (
    AGGREGATION_KEY,
    ASYNC_KEY,
    EVALUATOR_KEY,
    SERVER_OPT_KEY,
    enroll,
    leave,
    report_failure,
    with_metadata,
)
from client.errors import (
    ClientError,
    ClientExcluded,
    ClientNotSelected,
    ClientRevoked,
    Conflict,
    GatewayUnavailable,
    InvalidQuery,
    InvalidRequest,
    JobFailed,
    JobNotFound,
    MissingData,
    NotFound,
    PrivacyBudgetSpent,
    QueryFailed,
    RoundNotWritten,
    StaleRound,
    Unauthorized,
    UpdateRejected,
)
from client.flstore import NOT_INGESTED, flstore_query
from client.job import Assignment, Job, RoundClient
from client.node import FLClient, GlobalModel, JobCreated, UploadReceipt, create_job
from client.submit import attach_job, submit_job

__all__ = [
    "AGGREGATION_KEY",
    "ASYNC_KEY",
    "EVALUATOR_KEY",
    "NOT_INGESTED",
    "SERVER_OPT_KEY",
    "Assignment",
    "ClientError",
    "ClientExcluded",
    "ClientNotSelected",
    "ClientRevoked",
    "Conflict",
    "FLClient",
    "GatewayUnavailable",
    "GlobalModel",
    "InvalidQuery",
    "InvalidRequest",
    "Job",
    "JobCreated",
    "JobFailed",
    "JobNotFound",
    "MissingData",
    "NotFound",
    "PrivacyBudgetSpent",
    "QueryFailed",
    "RoundClient",
    "RoundNotWritten",
    "StaleRound",
    "Unauthorized",
    "UpdateRejected",
    "UploadReceipt",
    "attach_job",
    "create_job",
    "enroll",
    "flstore_query",
    "leave",
    "report_failure",
    "submit_job",
    "with_metadata",
]
