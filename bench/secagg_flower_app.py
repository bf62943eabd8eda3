"""bench-secagg's Flower App: Flower's SecAgg+ as its documentation deploys it.

Flower's own example (``examples/flower-secure-aggregation``, Flower 1.42): a ``ServerApp``
that runs the legacy ``FedAvg`` strategy in a ``DefaultWorkflow`` whose fit workflow is
``flwr.server.workflow.SecAggPlusWorkflow``, and a ``ClientApp`` (a ``NumPyClient``) with
``flwr.client.mod.secaggplus_mod``; run with ``flwr run`` on a SuperLink and one SuperNode per
client (:func:`bench.flower_baseline.run_flower_round` with ``app=`` this file). The run
config carries SecAgg+'s parameters (``num-shares``, ``reconstruction-threshold``,
``clipping-range``, ``quantization-range``, ``max-weight``, ``timeout``), the clients that drop
(``drop``: cids, comma-separated) and the marks' folder (``work``).

What the bench adds, outside Flower's code:

- :func:`bench_mod`, the ClientApp's first mod: at the setup stage (the round's first message)
  the client says it is ready and waits for the harness's go, then marks ``t_start_ns``; at
  the unmask stage a client in ``drop`` never answers (it waits until the round is
  aggregated: it dropped after sending its masked vector, before unmasking); every stage's
  message payload in and out is counted (:func:`payload_bytes`, written to
  ``bytes-<cid>-<stage>.json``);
- the workflow's ``timeout`` bounds its unmask stage only (:class:`TimedSecAggPlus`): the
  stage a dropped client is silent in; the other stages wait for every client, so a slow
  collection never drops one;
- the marks :func:`~bench.flower_baseline.run_flower_round` reads: the strategy's
  ``aggregate_fit`` entry and return (the published model), the ServerApp's pulls.

On Flower's Simulation Runtime (run config ``runtime = "simulation"``,
:func:`bench.flower_simulation.run_flower_simulation_round`; a client is its virtual
SuperNode's ``partition-id``) the ClientApps share a few Ray actors, so the barrier moves to
the ServerApp (it waits for the go before the setup stage; the clients mark their start as
they get it), and a dropped client answers its unmask message with an error at once instead
of holding its actor: Flower counts an error reply as a dropout, as it counts silence past the
timeout, so it does not wait out the timeout there.

Imported only by Flower's processes (Flower's environment, this repository on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, Message, RecordDict, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Stage
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.harness.flower_app import timed_pulls
from bench.runinfo import thread_counts

STAGE_KEY = "stage"


def payload_bytes(content: RecordDict) -> int:
    """The bytes a message's records carry: every array's data, every bytes or string value
    of its configs (lists summed), 8 per number; the framing around them is not counted."""
    total = 0
    for arrays in content.array_records.values():
        total += sum(len(a.data) for a in arrays.values())
    for config in content.config_records.values():
        for value in config.values():
            for item in value if isinstance(value, list) else [value]:
                total += len(item) if isinstance(item, bytes | str) else 8
    for metrics in content.metric_records.values():
        total += 8 * len(metrics)
    return total


def _stage(msg: Message) -> str:
    try:
        return str(msg.content.config_records[RECORD_KEY_CONFIGS][STAGE_KEY])
    except KeyError:
        return "other"


def bench_mod(msg: Message, ctxt: Context, call_next: Any) -> Message:
    """The bench's barrier, dropout and byte counts around Flower's own mods (see module)."""
    work = Path(str(ctxt.run_config["work"]))
    cid = _cid(ctxt)
    simulated = _simulated(ctxt)
    stage = _stage(msg)
    if stage == Stage.SETUP:
        if not simulated:  # on the Simulation Runtime the ServerApp waits for the go
            rc.wait_go(work, cid)
        marks = {"cid": cid, "pid": os.getpid(), "t_start_ns": time.monotonic_ns()}
        marks |= {"t_serialised_ns": marks["t_start_ns"], "thread_pools": thread_counts()}
        (work / f"client-{cid}.json").write_text(json.dumps(marks))
    drops = {int(c) for c in str(ctxt.run_config["drop"]).split(",") if c}
    if stage == Stage.UNMASK and cid in drops:
        if simulated:  # an actor held here would hold the clients queued behind it
            raise RuntimeError(f"client {cid} dropped before unmasking")
        while not (work / "aggregated").exists():  # gone: the server hears nothing
            time.sleep(0.05)
    received = payload_bytes(msg.content)
    reply = call_next(msg, ctxt)
    sent = payload_bytes(reply.content) if reply.has_content() else 0
    counts = {"received": received, "sent": sent}
    (work / f"bytes-{cid}-{stage}.json").write_text(json.dumps(counts))
    return reply


class BenchClient(NumPyClient):
    """Returns this client's weights (the harness's shared file) as its trained model."""

    def __init__(self, work: Path, cid: int) -> None:
        self.work, self.cid = work, cid

    def fit(self, parameters: Any, config: Any) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        layout, weights = rc.client_weights(self.work, self.cid)
        return [weights[n].view(np.ndarray) for n, _ in layout], 100 + self.cid, {}


def _cid(ctxt: Context) -> int:
    """The client's number: its SuperNode's ``cid``, or on the Simulation Runtime its
    virtual SuperNode's ``partition-id``."""
    config = ctxt.node_config
    return int(config["cid"] if "cid" in config else config["partition-id"])


def _simulated(ctxt: Context) -> bool:
    return str(ctxt.run_config.get("runtime", "deployment")) == "simulation"


def client_fn(context: Context) -> Any:
    return BenchClient(Path(str(context.run_config["work"])), _cid(context))


client = ClientApp(client_fn=client_fn, mods=[bench_mod, secaggplus_mod])
server = ServerApp()


class TimedSecAggPlus(SecAggPlusWorkflow):  # type: ignore[misc]
    """Flower's workflow; ``unmask_timeout`` bounds the unmask stage alone, and the setup
    stage's start is marked (``marks``)."""

    def __init__(self, marks: dict[str, Any], unmask_timeout: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.marks, self.unmask_timeout = marks, unmask_timeout

    def setup_stage(self, *args: Any) -> Any:
        self.marks["t_configure_ns"] = time.monotonic_ns()
        return super().setup_stage(*args)

    def unmask_stage(self, *args: Any) -> Any:
        self.timeout = self.unmask_timeout
        try:
            return super().unmask_stage(*args)
        finally:
            self.timeout = None


@server.main()
def main(grid: Grid, context: Context) -> None:
    """One round of FedAvg under SecAgg+ over ``num-clients`` SuperNodes."""
    cfg = context.run_config
    work = Path(str(cfg["work"]))
    n = int(cfg["num-clients"])
    if _simulated(context):  # the harness opens the window once the actors are up
        rc.wait_go(work, "server")
    marks = timed_pulls(grid)

    class Timed(FedAvg):  # type: ignore[misc]
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            marks["t_aggregate_start_ns"] = time.monotonic_ns()
            marks["results"] = len(results)
            marks["failures"] = [str(f)[:300] for f in failures]
            params, metrics = super().aggregate_fit(server_round, results, failures)
            marks["t_aggregate_end_ns"] = time.monotonic_ns()
            (work / "aggregated").touch()
            if params is not None:
                from flwr.common import parameters_to_ndarrays

                flat = [a.ravel() for a in parameters_to_ndarrays(params)]
                np.save(work / "global.npy", np.concatenate(flat).astype(np.float32))
            return params, metrics

    strategy = Timed(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_evaluate_clients=0,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([]),  # the clients send their own weights
    )
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    fit = TimedSecAggPlus(
        marks,
        float(cfg["timeout"]),
        num_shares=int(cfg["num-shares"]),
        reconstruction_threshold=int(cfg["reconstruction-threshold"]),
        max_weight=float(cfg["max-weight"]),
        clipping_range=float(cfg["clipping-range"]),
        quantization_range=int(cfg["quantization-range"]),
    )
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    marks["server_hwm_bytes"] = rw.status_bytes(os.getpid(), "VmHWM")
    marks["thread_pools"] = thread_counts()
    (work / "server.json").write_text(json.dumps(marks))
