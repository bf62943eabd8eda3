"""Flower's Simulation Runtime: one round of a Flower App over N virtual SuperNodes.

Where Flower's Deployment Runtime (:func:`bench.flower_baseline.run_flower_round`: a SuperLink
and one SuperNode, SuperExec and ClientApp process per client) does not fit this machine's
memory, Flower's own answer is its Simulation Runtime, which is also how its
``flower-secure-aggregation`` example runs: the ClientApps of N virtual SuperNodes run in a
pool of Ray actors, as many at once as the CPUs allow, and the messages never leave the
machine's memory. It is run here on a Ray cluster of the round's own, which the runtime's
``ray.init`` joins through ``RAY_ADDRESS`` (as it joins any running cluster), so that the
clients' side has a cgroup of its own:

- every process below in a network namespace of the round's own with loopback alone
  (:class:`PrivateNet`): Ray's servers listen on every interface and would otherwise be
  reachable on the machine's address;
- a Ray head (``ray start --head --block``, its node address 127.0.0.1) born
  in the round's clients group: its GCS, raylet, object store and the actors that run the
  ClientApps (``ray::ClientAppActor``, ``client_cpus`` CPUs each) are the clients' side;
- ``flower-superlink --simulation`` born in the server group, with ``RAY_ADDRESS``: its
  SuperExec starts ``flwr-simulation``, which runs the ServerApp and the runtime that hands
  messages to the actors; they are the server side;
- ``flwr run`` of the App with ``--federation-config "num-supernodes=N
  client-resources-num-cpus=C"``.

The App is told ``runtime = "simulation"`` in its run config: its clients do not wait at a
barrier (N clients on a few actors would never all be waiting), its ServerApp waits for the
harness's ``go`` instead (``ready-server``) once the actors are up, and the round's window
opens then. Flower's environment for this is :func:`~bench.harness.flower_env.flower_python`
with ``simulation=True`` (``flwr[simulation]``: Ray).

The record has the keys :func:`~bench.flower_baseline.run_flower_round`'s has that its
users read (``e2e_s``: the first client's setup mark -> ``aggregate_train`` returned,
``round_s``, ``cgroup``, ``model``, the sampled server memory, ``collect``'s keys), and
``runtime: "simulation"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.flower_baseline import (
    APP,
    _app,
    _stop,
    _toml,
    process_env,
    round_incomplete,
    wait_for,
)
from bench.harness import round_clients as rc
from bench.harness import round_window as rw
from bench.harness.flower_env import FLOWER_VERSION, flower_python
from bench.runinfo import PINNED_THREADS

if TYPE_CHECKING:
    from bench.harness.cgroups import RoundGroups

#: the title Ray gives an actor's process once it runs Flower's ClientApp actor
ACTOR_TITLE = b"ray::ClientAppActor"
#: the ports inside the round's namespace: the SuperLink's HTTP API and Ray's head
SUPERLINK_PORT, RAY_PORT = 9100, 6379


class PrivateNet:
    """A network namespace with only its loopback up, held by a ``sleep`` started with
    ``unshare --net`` (root); :meth:`argv` puts a command in it (``nsenter``), :meth:`listening`
    asks whether a port in it accepts connections. :meth:`stop` ends the holder; processes
    started in it are stopped by their owner."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec sleep infinity"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self._up():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                err = self.holder.stderr.read().decode() if self.holder.stderr else ""
                self.stop()
                raise RuntimeError(f"no network namespace (unshare --net: {err.strip()})")
            time.sleep(0.01)

    def _up(self) -> bool:
        try:
            return Path(f"/proc/{self.holder.pid}/cmdline").read_bytes().startswith(b"sleep")
        except OSError:
            return False

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--", *argv]

    def listening(self, port: int) -> bool:
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()"
        return subprocess.run(self.argv([sys.executable, "-c", probe]),
                              capture_output=True).returncode == 0  # fmt: skip

    def stop(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait(10)


def actors(pids: Sequence[int]) -> list[int]:
    """The pids among ``pids`` whose command line is a Ray ClientApp actor's."""
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(ACTOR_TITLE):
                out.append(pid)
        except OSError:
            continue
    return out


def run_flower_simulation_round(
    num_clients: int,
    layout: Sequence[tuple[str, Sequence[int]]] | None = None,
    *,
    groups: RoundGroups,
    seed: int = 0,
    timeout: float = 600.0,
    client_cpus: int = 1,
    floor_bytes: int = rw.DEFAULT_FLOOR_BYTES,
    keep_model: bool = False,
    app: Path = APP,
    app_config: Mapping[str, Any] | None = None,
    collect: Callable[[Path], dict[str, Any]] | None = None,
    failures: int = 0,
) -> dict[str, Any]:
    """One round of ``app`` on Flower's Simulation Runtime with ``num_clients`` virtual
    SuperNodes (see the module), the clients' weights as
    :func:`~bench.flower_baseline.run_flower_round` gives them. ``groups``: the round's
    cgroups (required: the server and clients sides are told apart by them alone); their CPUs
    are Ray's (``client_cpus`` each actor). ``failures``: the error replies the round is to
    have (the App's clients that drop answer with one here). A failure is a record, not
    raised."""
    from bench.harness.cgroups import born_in, parse_cpus

    layout = [(n, list(s)) for n, s in (layout or rc.resnet18_layout())]
    size = rc.layout_bytes(layout)
    cpus = len(parse_cpus(groups.clients.cpus))  # Ray is given the clients' CPUs
    base = {
        "flwr_version": FLOWER_VERSION,
        "api": "Message API (ServerApp + ClientApp), Simulation Runtime (Ray, "
        f"{max(1, cpus // client_cpus)} ClientApp actors of {client_cpus} CPU)",
        "runtime": "simulation",
        "num_clients": num_clients,
        "update_bytes": size,
        "num_tensors": len(layout),
    }
    python = flower_python(simulation=True)
    procs: list[subprocess.Popen[bytes]] = []
    net: PrivateNet | None = None
    guard: rw.MemoryGuard | None = None
    peak: rw.PeakMemory | None = None
    shared = Path(f"/dev/shm/fedfaas-bench-flower-sim-{os.getpid()}-{time.monotonic_ns()}")
    with tempfile.TemporaryDirectory(prefix="flower-sim-") as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        app_dir, home = _app(
            root, SUPERLINK_PORT, app, {**(app_config or {}), "runtime": "simulation"}
        )
        env = process_env(python, home)
        env |= {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": f"127.0.0.1:{RAY_PORT}"}
        try:
            rc.share_weights(work, layout, seed=seed, shared=shared, weights=None)
            net = PrivateNet()

            def spawn(argv: list[str], logname: str, side: str) -> subprocess.Popen[bytes]:
                assert net is not None
                with open(root / logname, "wb") as logf, born_in(getattr(groups, side)):
                    p = subprocess.Popen(
                        net.argv([str(python.parent / argv[0]), *argv[1:]]), cwd=root,
                        env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                procs.append(p)
                return p

            ray = spawn(
                ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                 f"--port={RAY_PORT}", f"--num-cpus={cpus}", "--num-gpus=0",
                 "--include-dashboard=false", "--disable-usage-stats",
                 f"--temp-dir={root / 'ray'}"],
                "ray.log", "clients",
            )  # fmt: skip
            superlink = spawn(
                ["flower-superlink", "--simulation", "--insecure", "--host", "127.0.0.1",
                 "--port", str(SUPERLINK_PORT), "--disable-runtime-dependency-installation"],
                "superlink.log", "server",
            )  # fmt: skip
            guard = rw.MemoryGuard(
                lambda: [superlink.pid], lambda: _stop(procs),
                client_pids=lambda: [ray.pid], floor_bytes=floor_bytes,
            )  # fmt: skip
            guard.start()
            deadline = time.monotonic() + timeout

            def check() -> dict[str, Any] | None:
                return rw.point_failure(
                    guard, ("superlink", superlink, root / "superlink.log"),
                    [(ray, root / "ray.log")], deadline,
                    f"no aggregated model in {timeout:.0f} s", server_may_finish=False, **base,
                )  # fmt: skip

            for port in (RAY_PORT, SUPERLINK_PORT):
                if (bad := wait_for(lambda p=port: net.listening(p), check, 0.2)) is not None:
                    return bad
            config = f"work='{work}' num-clients={num_clients}"
            config += "".join(f" {k}={_toml(v)}" for k, v in (app_config or {}).items())
            submit = subprocess.run(
                net.argv([str(python.parent / "flwr"), "run", str(app_dir), "bench",
                          "--run-config", config, "--federation-config",
                          f"num-supernodes={num_clients} "
                          f"client-resources-num-cpus={client_cpus}"]),
                cwd=root, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if submit.returncode != 0:
                return rw.failure(
                    "error", f"flwr run exited {submit.returncode}: {submit.stdout[-1500:]}"
                    f"{submit.stderr[-1500:]}", **base,
                )  # fmt: skip
            # the ServerApp waits for go; the round starts once every actor is up
            want = max(1, min(num_clients, cpus // client_cpus))

            def actors_up() -> bool:
                ready = (work / "ready-server").exists()
                return ready and len(actors(groups.clients.pids())) >= want

            if (bad := wait_for(actors_up, check, 0.05)) is not None:
                return bad
            idle_rss = rw.summed_rss([superlink.pid])
            rw.reset_hwm([superlink.pid])
            groups.open_window()
            peak = rw.PeakMemory(lambda: [superlink.pid])
            peak.start()
            (work / "go").touch()
            if (bad := wait_for((work / "aggregated").exists, check)) is not None:
                return bad
            acct = groups.close_window()
            hwm = rw.summed_hwm([superlink.pid])
            peak.stop()
            if (bad := wait_for((work / "server.json").exists, check)) is not None:
                return bad
            marks = json.loads((work / "server.json").read_text())
            if (bad := round_incomplete(marks, num_clients, base, failures)) is not None:
                return bad
            clients = [json.loads(p.read_text()) for p in work.glob("client-*.json")]
            model = np.load(work / "global.npy") if keep_model else None
            extra = collect(work) if collect is not None else {}
        finally:
            if peak is not None:
                peak.stop()
            if guard is not None:
                guard.stop()
            _stop(procs)
            if net is not None:
                net.stop()
            shared.unlink(missing_ok=True)
    end = marks["t_aggregate_end_ns"]
    out: dict[str, Any] = {
        "ok": True,
        **base,
        "method": (
            "window: the ServerApp released (go) -> the first client's setup-stage mark is "
            "its start -> aggregate_train returned in the ServerApp; memory: the server "
            "group's cgroup peak (SuperLink, SuperExec, flwr-simulation: the ServerApp and "
            "the runtime) over the window, the clients group's (the Ray head and its "
            "ClientApp actors)"
        ),
        "e2e_s": rw.window_s([c["t_start_ns"] for c in clients], end),
        "aggregate_s": (end - marks["t_aggregate_start_ns"]) / 1e9,
        "round_s": rw.window_s([marks["t_configure_ns"]], end),
        **rw.sampled_memory(peak, hwm, idle_rss, guard),
        "thread_pools": {"server": marks["thread_pools"], "client": clients[0]["thread_pools"]},
        "threads_env": dict(PINNED_THREADS),
        "cgroup": acct,
    }
    if model is not None:
        out["model"] = model
    return {**out, **extra}
