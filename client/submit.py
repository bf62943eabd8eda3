"""Create a job on the control plane (:func:`submit_job`) or take one up again
(:func:`attach_job`): both give its handle, a :class:`~client.job.Job`."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import httpx

from client.control import (
    AGGREGATION_KEY,
    ASYNC_KEY,
    EVALUATOR_KEY,
    SERVER_OPT_KEY,
    call,
    with_metadata,
)
from client.job import Job
from client.tls import CaFile


def submit_job(
    control_plane_url: str,
    job: str,
    initial_weights: bytes,
    *,
    rounds: int,
    admin_token: str,
    clients: list[str] | None = None,
    goal: int | None = None,
    policy: str = "leastconn",
    per_leaf: int = 2,
    overprovision: float = 1.0,
    deadline_s: float = 600.0,
    min_updates: int = 1,
    on_shortfall: str = "reopen",
    max_reopens: int = 1,
    selection: str = "random",
    evaluator: Mapping[str, Any] | None = None,
    server_opt: Mapping[str, Any] | None = None,
    fedbuff: Mapping[str, Any] | None = None,
    aggregation: Mapping[str, Any] | None = None,
    drop_flagged: Mapping[str, Any] | None = None,
    secure_aggregation: Mapping[str, Any] | None = None,
    tracker_url: str | None = None,
    analyst_token: str | None = None,
    timeout: float = 120.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
) -> Job:
    """Create ``job`` on the control plane (``POST /v1/jobs``), which creates it on the node
    gateways, places the clients and opens round 1; returns its handle (:class:`Job`).

    Parameters
    ----------
    control_plane_url : e.g. ``http://127.0.0.1:8070``.
    job : job name (``[a-z0-9][a-z0-9-]{0,39}``).
    initial_weights : the model's initial weights as safetensors bytes.
    rounds : number of rounds.
    clients : clients enrolled at creation; each uploads with its token from the answer's
        ``tokens``. Others enroll later (:meth:`Job.enroll`, or :func:`client.control.enroll`
        with the answer's ``enrollment_token``);
        round 1 opens once ``goal`` clients are enrolled.
    admin_token : the control plane's admin token (the gateways' admin secret, read from its
        file, e.g. ``.state/secrets/gateway-admin-secret``).
    goal : updates that close a round (default: every client enrolled at creation).
    policy : placement, ``"leastconn"`` (spread over the nodes) or ``"bestfit"`` (pack).
    per_leaf : updates per leaf aggregator.
    overprovision : clients selected per round / goal.
    deadline_s : seconds a round may take. At its deadline a round closes with what arrived
        if at least ``min_updates`` came; else it gets another deadline
        (``on_shortfall="reopen"``, at most ``max_reopens`` times) or the job fails
        (``"fail"``; the job's view then says why in ``failed``).
    selection : how each round's clients are chosen: ``"random"``, or ``"oort"``: from round
        2 on, the control plane asks FLStore's request tracker for Oort's selection (utility
        from the clients' ``loss`` and ``n_samples``, speed from their ``duration_s``, in the
        ``meta`` of their uploads; unseen clients are explored). When the tracker cannot
        answer, the round is random and its ``selection_note`` in the job's view says why.
    evaluator : the job's validation-set evaluator for FLStore's contribution workloads
        (Shapley, leave-one-out), e.g. ``{"kind": "digits-softmax", "split_seed": 0}`` (see
        ``cache_engine.evaluators``); it travels in the weights' safetensors metadata
        (``fedfaas.evaluator``) and the gateways write it into every round's ``meta.json``.
    server_opt : the server optimizer the root applies to each round's FedAvg, e.g.
        ``{"name": "fedadam", "eta": 0.01}``: ``fedavgm`` (``eta``, ``momentum``),
        ``fedadam`` / ``fedyogi`` (``eta``, ``beta_1``, ``beta_2``, ``tau``), ``fedadagrad``
        (``eta``, ``tau``); unnamed ones take Flower's defaults (``core.server_opt``). It
        travels in the weights' safetensors metadata (``core.server_opt``); its state is
        checkpointed beside each round's model.
    fedbuff : run the job asynchronously (FedBuff; ``{}`` takes the defaults): a round is a
        buffer of ``goal`` updates, each trained on any of the last ``max_staleness + 1``
        versions (default 4) and weighted by its staleness (``staleness``: ``"poly"``
        ``(1+s)^-a``, a = 0.5; ``"hinge"`` with ``a``, ``b``; ``"constant"``); a full buffer
        moves the model by ``eta`` (default 1) times its weighted mean delta
        (``core.fedbuff``). The clients selected per round (``overprovision``) are the
        ones training at once. Not with ``server_opt``.
    aggregation : a rule against poisoned updates instead of FedAvg (``core.robust``):
        ``{"rule": "median"}``, ``{"rule": "trimmed-mean", "beta": 0.1}``,
        ``{"rule": "krum", "f": 2}``, ``{"rule": "multi-krum", "f": 2, "m": 6}`` or
        ``{"rule": "fltrust", "root_client": "server"}`` (that client's update, trained on the
        job owner's clean root data, is the trusted reference); ``"shards": S`` sets the
        number of coordinate shards (default: one per aggregator endpoint). The root gateway
        runs it on the round's updates in its shared memory; the job stays on that node. Not
        with ``fedbuff``. Each round's ``meta.json`` records the decision. Central
        differential privacy is the rule ``{"rule": "dp-fedavg", "clip": C,
        "noise_multiplier": z, "delta": 1e-5, "epsilon": budget}`` (DP-FedAvg: each delta
        clipped to norm ``C``, noise of std ``z C`` on their sum, divided by ``goal``); the
        control plane accounts the epsilon spent and ends the job before a round that would
        pass ``epsilon`` (the job's ``privacy`` and ``stopped``).
    drop_flagged : the debugging loop: ``{"workload": "multi-krum", "params": {"f": 1}}``
        (or ``"cosine-to-aggregate"``) has the control plane ask FLStore, after each round,
        which clients that workload flags, and drop them from every later round before
        aggregation (their uploads are refused; each round's ``meta.json`` names them under
        ``excluded``). Needs the request tracker (``fedfaas up --with all`` wires it).
    secure_aggregation : SecAgg+ (:mod:`client.secure`): the server learns only each round's
        sum, never a client's update. ``{}`` takes the defaults; its fields: ``clip`` (each
        value clipped to ``[-clip, clip]``, default 1), ``bits`` (quantization, default 16),
        ``threshold`` (shares that rebuild a seed, as a fraction of a client's neighbours,
        default 2/3), ``neighbours`` (per client, even; default every other client),
        ``max_weight`` (the sample count that weighs 1, default 1000) and ``stage_timeout_s``
        (how long a stage waits for its last clients, default 30). The clients take part with
        :class:`client.secure.SecureRound`; the job serves the FedAvg as one float32 tensor
        (:func:`client.secure.unflatten`). Not with ``aggregation``, ``fedbuff``,
        ``server_opt``, ``evaluator`` or ``drop_flagged``, which read single updates or the
        model as floats (400 ``bad_secure_aggregation``); its rounds' updates are kept out of
        MinIO and FLStore.
    tracker_url, analyst_token : FLStore's request tracker and its analyst (or admin) token,
        for :meth:`Job.query` (e.g. ``http://127.0.0.1:8092`` and the platform's
        ``.state/secrets/analyst-token``).
    timeout : seconds for each request.
    transport : optional httpx transport (tests).
    ca_file : the platform's CA certificate, for ``https://`` URLs (:mod:`client.tls`;
        ``fedfaas up``, TLS by default, writes ``.state/secrets/tls/ca.crt``); the handle uses
        it for every later call (the control plane, the gateways, the tracker).

    Returns
    -------
    Job
        The job's handle. It also reads as the control plane's answer (a mapping): the job's
        view (``job["round"]``, ...), ``job["tokens"]`` (client id -> its bearer token, for
        the clients enrolled at creation) and ``job["enrollment_token"]``.

    Raises
    ------
    UpdateRejected
        The control plane refused the job (4xx, with its ``error`` and ``detail``).
    GatewayUnavailable
        The control plane could not be reached, or answered with a 5xx.
    """
    clients = list(clients or [])
    if goal is None and not clients:
        raise ValueError("a job created without clients needs its goal")
    if secure_aggregation is not None:
        from client.secure import masked_initial_weights  # needs the [secagg] extra

        initial_weights = masked_initial_weights(initial_weights, secure_aggregation)
    if evaluator is not None:
        spec = json.dumps(dict(evaluator), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {EVALUATOR_KEY: spec})
    if server_opt is not None:
        spec = json.dumps(dict(server_opt), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {SERVER_OPT_KEY: spec})
    if fedbuff is not None:
        spec = json.dumps(dict(fedbuff), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {ASYNC_KEY: spec})
    if aggregation is not None:
        spec = json.dumps(dict(aggregation), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {AGGREGATION_KEY: spec})
    body = {
        "job": job,
        "rounds": rounds,
        "goal": len(clients) if goal is None else goal,
        "clients": clients,
        "policy": policy,
        "per_leaf": per_leaf,
        "overprovision": overprovision,
        "deadline_s": deadline_s,
        "min_updates": min_updates,
        "on_shortfall": on_shortfall,
        "max_reopens": max_reopens,
        "selection": selection,
        "weights_b64": base64.b64encode(initial_weights).decode(),
    }
    if drop_flagged is not None:
        body["drop_flagged"] = dict(drop_flagged)
    resp = call(
        "POST",
        control_plane_url,
        "/v1/jobs",
        admin_token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
        json=body,
    )
    return Job(
        control_plane_url,
        job,
        admin_token,
        created=resp.json(),
        tracker_url=tracker_url,
        analyst_token=analyst_token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
    )


def attach_job(
    control_plane_url: str,
    job: str,
    *,
    admin_token: str,
    tracker_url: str | None = None,
    analyst_token: str | None = None,
    timeout: float = 120.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
) -> Job:
    """The handle of ``job``, created earlier (by this process or another): its creation
    answer is its current view, without tokens (:meth:`Job.enroll` gives a client's token
    again: enrolling again returns the same token). Raises
    :class:`~client.errors.JobNotFound` for a job the control plane does not know."""
    view = call(
        "GET",
        control_plane_url,
        f"/v1/jobs/{job}",
        admin_token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
    ).json()
    return Job(
        control_plane_url,
        job,
        admin_token,
        created=view,
        tracker_url=tracker_url,
        analyst_token=analyst_token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
    )
