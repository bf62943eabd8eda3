"""Robust aggregation benchmark (issue 15): 20 ResNet-18 updates, 4 of them poisoned.

One run, this machine, both sides on the same 20 updates (ResNet-18's floating-point state,
44.7 MB float32 each; honest ones are ``g + common + noise``, two are sign-flipped
``g - delta`` and two scaled ``g + 100 delta``):

- FedFaaS: a node gateway (``python -m gateway``, userspace router) and one replica of the
  ``aggregator`` function with two endpoints (this machine's two cores). For each rule a job is
  created with that rule and two shards, the 20 updates are uploaded over HTTP, and the round is
  run as coordinate shards on the endpoints. Figures: ``shards_s``, the gateway's own time from
  the round holding its 20 updates to the result sealed (its log line); ``to_model_s``, the last
  upload's 202 to the published model seen by a client polling every 2 ms; ``server_peak``: the
  server's memory from the first upload to the published model, every page once (the gateway's
  and the replica's private and file pages, the store's shared memory holding the 20 updates
  once; ``bench.harness.round_window.PeakMemory``, sampled every 5 ms).
- Flower 1.32.1: ``FedMedian`` and ``Krum`` (``num_malicious_clients=4``) ``aggregate_fit`` on
  the same 20 updates as ``FitRes`` with serialized ``Parameters`` (what a Flower server holds
  when the round's results are in), each in its own fresh process: time of ``aggregate_fit``
  (deserialization included, as Flower does it) and the process's peak RSS during it (``VmHWM``
  reset just before; the 20 serialized updates it holds are in it, as the store is in ours).
- Distances: for FedAvg (the sample-weighted mean) and for each rule's published model, ``|x -
  h| / |h - g|`` with ``h`` the honest updates' mean: how far the model moved from where the
  honest clients would take it, relative to their step.

BLAS and OpenMP pinned to one thread per process (``bench.runinfo.pinned_threads``); the
replica's two endpoints are its parallelism. Usage: ``python -m bench.robust [--out DIR]``;
writes ``bench/results/robust.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness.aggregators import NodeAggregators
from bench.harness.round_window import PeakMemory
from bench.runinfo import pinned_threads, run_header, run_info, write_result
from client.sdk import AGGREGATION_KEY, with_metadata
from fedfaas import wire
from fedfaas.services import RedisServer, free_port, stop_group, wait_for_port
from gateway.settings import GatewaySettings

N, BAD_FLIP, BAD_SCALE = 20, ("c00", "c01"), ("c02", "c03")
RULES = [
    {"rule": "median"},
    {"rule": "trimmed-mean", "beta": 0.2},
    {"rule": "krum", "f": 4},
    {"rule": "multi-krum", "f": 4},
    {"rule": "fltrust", "root_client": "c19"},
    # central DP's path (norms, clipping, the noise drawn in the shards): clip above the honest
    # deltas' norms (about 38), so clipping bounds the scaled ones; z so small that the noise
    # (std z C / 20 = 0.0025) leaves the distance readable: a timing of the path, not a
    # privacy setting (20 clients give no useful epsilon)
    {"rule": "dp-fedavg", "clip": 50.0, "noise_multiplier": 0.001, "seed": 1},
]
OUT = Path(__file__).resolve().parent / "results"


def resnet18() -> dict[str, np.ndarray]:
    import torch
    import torchvision

    torch.manual_seed(0)
    sd = torchvision.models.resnet18(weights=None).state_dict()
    return {k: v.numpy().astype(np.float32) for k, v in sd.items() if v.is_floating_point()}


def updates(g: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(15)
    common = {k: 0.01 * rng.standard_normal(v.shape).astype(np.float32) for k, v in g.items()}
    out = {}
    for i in range(N):
        c = f"c{i:02d}"
        d = {
            k: common[k] + 0.005 * rng.standard_normal(v.shape).astype(np.float32)
            for k, v in g.items()
        }
        sign = -1.0 if c in BAD_FLIP else 100.0 if c in BAD_SCALE else 1.0
        out[c] = {k: (g[k] + sign * d[k]).astype(np.float32) for k in g}
    return out


def flat(m: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([m[k].ravel() for k in sorted(m)])


def _gateway(tmp: Path, redis: RedisServer) -> tuple[subprocess.Popen[bytes], GatewaySettings]:
    s = GatewaySettings(
        node="n1",
        port=free_port(),
        state_dir=tmp / "state",
        redis_url=redis.url,
        redis_credentials_file=redis.credentials_file("gateway"),
        shm_root=Path("/dev/shm") / f"fedfaas-bench-robust-{os.getpid()}",
        prefer_ebpf=False,
        pool=N + 4,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_GATEWAY_")}
    log = open(tmp / "gateway.log", "ab")  # noqa: SIM115 (the child writes it until stopped)
    p = subprocess.Popen(
        s.to_argv(log_level="INFO"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    wait_for_port("127.0.0.1", s.port, 60, p)
    return p, s


def fedfaas_side(
    tmp: Path, g: dict[str, np.ndarray], ups: dict[str, dict[str, np.ndarray]]
) -> dict[str, Any]:
    redis = RedisServer(data_dir=tmp / "redis").start()
    gw, s = _gateway(tmp, redis)
    url = f"http://127.0.0.1:{s.port}"
    secret = (s.state_dir / "admin-secret").read_text().strip()
    aggs = NodeAggregators(
        "n1",
        s.socket_path(),
        tmp / "aggregators",
        url,
        admin_secret_file=s.state_dir / "admin-secret",
    )
    bodies = {c: wire.encode_tensors(u) for c, u in ups.items()}
    clients = sorted(ups)
    rows = {}
    try:
        aggs.spawn(1, endpoints=2)
        aggs.wait_registered(2)
        for spec in [{"rule": "fedavg"}, *RULES]:
            name = spec["rule"]
            body = wire.encode_tensors(g)
            if name != "fedavg":
                body = with_metadata(body, {AGGREGATION_KEY: json.dumps({**spec, "shards": 2})})
            r = httpx.post(
                url + "/v1/jobs",
                params={"job": name, "rounds": 1, "goal": N, "clients": ",".join(clients)},
                content=body,
                headers={"Authorization": f"Bearer {secret}"},
                timeout=60,
            )
            r.raise_for_status()
            tokens = r.json()["tokens"]
            peak = PeakMemory(lambda: [gw.pid, *aggs.pids()], [s.shm_root])
            peak.start()
            with httpx.Client(timeout=60) as h:
                for c in clients:
                    a = h.post(
                        f"{url}/v1/jobs/{name}/rounds/1/updates",
                        content=bodies[c],
                        headers={
                            "Authorization": f"Bearer {tokens[c]}",
                            "X-Client-Id": c,
                            "X-Sample-Count": "10",
                        },
                    )
                    a.raise_for_status()
                t_last = time.perf_counter()
                while True:
                    m = h.get(
                        f"{url}/v1/jobs/{name}/model",
                        headers={"Authorization": f"Bearer {tokens['c05']}"},
                    )
                    if int(m.headers["x-model-version"]) >= 1:
                        break
                    time.sleep(0.002)
                to_model = time.perf_counter() - t_last
                server_peak = peak.stop()
                h.delete(f"{url}/v1/jobs/{name}", headers={"Authorization": f"Bearer {secret}"})
            rows[name] = {
                "model": flat(wire.decode_tensors(m.content)),
                "to_model_s": to_model,
                "server_peak_bytes": server_peak,
            }
        log = (tmp / "gateway.log").read_text()
        for name in rows:
            if name == "fedavg":
                continue
            hit = re.findall(rf"round 1: {re.escape(name)} done in ([0-9.]+) ms", log)
            rows[name]["shards_s"] = float(hit[-1]) / 1e3 if hit else None
    finally:
        aggs.stop()
        stop_group(gw, 20)
        shutil.rmtree(s.shm_root, ignore_errors=True)  # a stopped gateway keeps its stores
        redis.stop()
    return rows


_FLOWER = r"""
import json, resource, sys, time
import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.strategy import FedMedian, Krum
data = np.load(sys.argv[2])
names = sorted({k.split("/", 1)[1] for k in data.files})
clients = sorted({k.split("/", 1)[0] for k in data.files})
res = [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([data[f"{c}/{n}"] for n in names]), 10, {})) for c in clients]
del data
with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here: the aggregation's own peak
    f.write("5")
s = FedMedian() if sys.argv[1] == "median" else Krum(num_malicious_clients=4)
t = time.perf_counter()
out, _ = s.aggregate_fit(1, res, [])
dt = time.perf_counter() - t
from flwr.common import parameters_to_ndarrays
np.save(sys.argv[3], np.concatenate([a.ravel() for a in parameters_to_ndarrays(out)]))
hwm = [int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmHWM:")][0]
print(json.dumps({"aggregate_fit_s": dt, "peak_rss_bytes": hwm}))
"""


def flower_side(tmp: Path, ups: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    path = tmp / "updates.npz"
    np.savez(path, **{f"{c}/{k}": v for c, u in ups.items() for k, v in u.items()})
    out = {}
    for rule in ("median", "krum"):
        res = subprocess.run(
            [sys.executable, "-c", _FLOWER, rule, str(path), str(tmp / f"flower-{rule}.npy")],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row["model"] = np.load(tmp / f"flower-{rule}.npy")
        out[rule] = row
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        "# Robust aggregation: 20 ResNet-18 updates, 4 poisoned",
        "",
        run_header(r["run"]),
        "",
        f"Poisoned: {', '.join(r['poisoned']['sign_flipped'])} sign-flipped, "
        f"{', '.join(r['poisoned']['scaled_100x'])} scaled by 100. Distance: |x - h| / |h - g| "
        "(h: the honest updates' mean, g: the round's starting model).",
        "",
        "| rule | distance from the honest mean | FedFaaS shards (gateway) | last upload -> model | server peak memory |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in r["fedfaas"].items():
        sh = row.get("shards_s")
        lines.append(
            f"| {name} | {row['distance']:.4f} | {'-' if sh is None else f'{sh:.3f} s'} | "
            f"{row['to_model_s']:.3f} s | {row['server_peak_bytes'] / 2**20:.0f} MiB |"
        )
    lines += [
        "",
        "Against Flower 1.32.1 on the same updates (each in a fresh process; its time includes "
        "deserializing the 20 `Parameters`, as its server does):",
        "",
        "| rule | Flower aggregate_fit | FedFaaS shards | speed-up | Flower peak RSS | FedFaaS server peak | memory ratio | same model |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, fl in r["flower"].items():
        ff = r["fedfaas"][name]
        mem = ff["server_peak_bytes"]
        lines.append(
            f"| {name} | {fl['aggregate_fit_s']:.3f} s | {ff['shards_s']:.3f} s | "
            f"{fl['aggregate_fit_s'] / ff['shards_s']:.2f}x | {fl['peak_rss_bytes'] / 2**20:.0f} MiB | "
            f"{mem / 2**20:.0f} MiB | {fl['peak_rss_bytes'] / mem:.2f}x | "
            f"{fl['max_abs_diff_to_fedfaas'] == 0.0} (max abs diff {fl['max_abs_diff_to_fedfaas']:.2e}) |"
        )
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["fedfaas"])
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].bar(names, [r["fedfaas"][n]["distance"] for n in names])
    ax[0].set_yscale("log")
    ax[0].set_title("distance from the honest mean (log)")
    fl = list(r["flower"])
    x = np.arange(len(fl))
    ax[1].bar(x - 0.2, [r["flower"][n]["aggregate_fit_s"] for n in fl], 0.4, label="Flower")
    ax[1].bar(x + 0.2, [r["fedfaas"][n]["shards_s"] for n in fl], 0.4, label="FedFaaS, 2 shards")
    ax[1].set_xticks(x, fl)
    ax[1].set_ylabel("seconds")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    with pinned_threads(1) as threads:
        info = run_info("bench.robust", argv)
        info["threads"] = threads
        g = resnet18()
        ups = updates(g)
        gf = flat(g)
        honest = np.mean([flat(u) for c, u in ups.items() if c not in BAD_FLIP + BAD_SCALE], axis=0)
        step = np.linalg.norm(honest - gf)
        with tempfile.TemporaryDirectory(prefix="bench-robust-") as d:
            tmp = Path(d)
            ff = fedfaas_side(tmp, g, ups)
            fl = flower_side(tmp, ups)
    for name, row in fl.items():  # Flower's model against FedFaaS's published one
        m = row.pop("model")
        row["distance"] = float(np.linalg.norm(m - honest) / step)
        row["max_abs_diff_to_fedfaas"] = float(np.abs(m - ff[name]["model"]).max())
    for row in ff.values():
        row["distance"] = float(np.linalg.norm(row.pop("model") - honest) / step)
    result = {
        "run": info,
        "clients": N,
        "poisoned": {"sign_flipped": list(BAD_FLIP), "scaled_100x": list(BAD_SCALE)},
        "fedfaas": ff,
        "flower": fl,
    }
    stored, md = write_result(result, "robust", render, args.out)
    plot(stored, args.out / "robust.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
