"""The benchmark's Flower App: a ``ServerApp`` and a ``ClientApp`` on Flower's Message API.

What Flower's documentation recommends today (Flower 1.21+, "Upgrade to Message API"; run with
``flwr run`` on a SuperLink and SuperNodes, the Deployment Runtime): the ``ServerApp`` runs a
built-in strategy of :mod:`flwr.serverapp.strategy` (``FedAvg``, ``FedMedian`` or ``Krum``,
the run config's ``rule``) for one round through its ``start`` method; each ``ClientApp``'s
``train`` function returns the client's "trained weights" as an ``ArrayRecord`` with the
example count in a ``MetricRecord`` (``num-examples``, the FedAvg weight).

:func:`bench.flower_baseline.run_flower_round` copies this file into a Flower App folder, builds
and runs it, and reads the marks the apps leave in the run config's ``work`` folder:

- each ClientApp (its SuperNode's ``cid`` in the node config) maps the weights file all
  clients share (:func:`bench.harness.rc.map_weights`, every page touched), says
  ``ready-<cid>``, waits for the harness's ``go``, marks ``t_start_ns`` (weights in memory,
  nothing serialised yet) in ``client-<cid>.json``, and only then builds the ``ArrayRecord``
  (Flower serialises each array as it is added): serialisation is inside the window;
- the ServerApp marks each pull of replies from the SuperLink (start, end, replies) and the
  strategy's ``aggregate_train`` entry and return (the global ``ArrayRecord``, serialised, is
  then sealed), touches ``aggregated`` as it returns, and writes ``server.json``.

Imported only by Flower's processes (Flower's own environment, this repository on
``PYTHONPATH``), never by the platform.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, FedMedian, Krum

from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.runinfo import thread_counts

client = ClientApp()
server = ServerApp()

#: the strategies the run config's ``rule`` names (Krum with the robust bench's 4 poisoned)
STRATEGIES: dict[str, Any] = {
    "fedavg": (FedAvg, {}),
    "median": (FedMedian, {}),
    "krum": (Krum, {"num_malicious_nodes": 4}),
}


@client.train()
def train(msg: Message, context: Context) -> Message:
    """Return this client's weights (a file shared by every client, or its own under
    ``weights-<cid>``) after the harness's go."""
    work = Path(str(context.run_config["work"]))
    cid = int(context.node_config["cid"])
    layout, weights = rc.client_weights(work, cid)
    arrays = [weights[n].view(np.ndarray) for n, _ in layout]
    rc.wait_go(work, cid)
    t_start = time.monotonic_ns()  # weights in memory; nothing serialised
    reply = RecordDict(
        {
            "arrays": ArrayRecord(arrays),
            "metrics": MetricRecord({"num-examples": 100 + cid}),
        }
    )
    marks = {
        "cid": cid,
        "pid": os.getpid(),
        "t_start_ns": t_start,
        "t_serialised_ns": time.monotonic_ns(),
        "thread_pools": thread_counts(),
    }
    (work / f"client-{cid}.json").write_text(json.dumps(marks))
    return Message(content=reply, reply_to=msg)


def timed_pulls(grid: Grid) -> dict[str, Any]:
    """The ServerApp's marks, started: its pid, and each pull of replies from the SuperLink
    (Flower's grid polls every 3 s) as ``[start_ns, end_ns, replies]`` under ``"pulls"``, to
    split the server window into its parts (``bench.flower_baseline``); ``grid`` records them
    from here on."""
    marks: dict[str, Any] = {"pid": os.getpid(), "pulls": []}
    pull = grid.pull_messages

    def timed_pull(message_ids: Any) -> Any:
        t0 = time.monotonic_ns()
        got = list(pull(message_ids))
        marks["pulls"].append([t0, time.monotonic_ns(), len(got)])
        return got

    grid.pull_messages = timed_pull  # type: ignore[method-assign]
    return marks


@server.main()
def main(grid: Grid, context: Context) -> None:
    """One round of the run config's ``rule`` over ``num-clients`` SuperNodes."""
    work = Path(str(context.run_config["work"]))
    n = int(context.run_config["num-clients"])
    base, extra = STRATEGIES[str(context.run_config["rule"])]
    marks = timed_pulls(grid)

    class Timed(base):  # type: ignore[misc, valid-type]
        def configure_train(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
            out = super().configure_train(server_round, *args, **kwargs)
            marks["t_configure_ns"] = time.monotonic_ns()
            return out

        def aggregate_train(self, server_round: int, replies: Any) -> Any:
            marks["t_aggregate_start_ns"] = time.monotonic_ns()
            replies = list(replies)
            marks["results"] = sum(1 for m in replies if not m.has_error())
            marks["failures"] = [str(m.error)[:300] for m in replies if m.has_error()]
            arrays, metrics = super().aggregate_train(server_round, replies)
            marks["t_aggregate_end_ns"] = time.monotonic_ns()
            (work / "aggregated").touch()  # the harness closes its window now
            if arrays is not None:  # what the strategy published, for the same-model check
                flat = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
                np.save(work / "global.npy", flat)
            return arrays, metrics

    strategy = Timed(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_evaluate_nodes=0,
        min_available_nodes=n,
        **extra,
    )
    # the model sent to the clients carries no tensors: they return their own weights, and
    # FedFaaS's clients in the same benchmark download none either
    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=1)
    marks["server_hwm_bytes"] = rw.status_bytes(os.getpid(), "VmHWM")
    marks["thread_pools"] = thread_counts()
    (work / "server.json").write_text(json.dumps(marks))
