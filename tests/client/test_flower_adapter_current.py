"""The Flower adapter (client.flower) with the newest Flower: a ``flwr.client.NumPyClient`` of
Flower 1.42 takes part in a FedFaaS job, unchanged (issue 37).

The clients run in Flower's own environment (bench.harness.flower_env: ``flwr==1.42.0``, made
on first use and cached; this repository's ``client`` package on its path, the platform not
importable there), against a real control plane process and two real node gateways with
aggregator replicas. Two Flower clients train two rounds; every published model is the
FedAvg of what their ``fit`` returned, weighted by the examples it reported, and each
``evaluate`` saw the model its round started from.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from bench.harness.flower_env import FLOWER_VERSION, flower_python
from client.flower import flower_weights
from control_plane.settings import ControlPlaneSettings
from core.auth import bearer
from core.services import RedisServer, free_port, stop_group, wait_for_port
from tests.conftest import RedisURL
from tests.control import realgw

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

#: a Flower client as Flower's quickstarts write one, run through the adapter
CLIENT = r"""
import json, sys
import flwr
import numpy as np
from flwr.client import NumPyClient
from client.flower import run_numpy_client

assert not any(m.split(".")[0] in {"fedfaas", "gateway", "control_plane"} for m in sys.modules)
url, job, cid, token, step = sys.argv[1:6]
seen = []

class Client(NumPyClient):
    def get_parameters(self, config):
        return [np.zeros(6, np.float32), np.zeros((2, 3), np.float32)]

    def fit(self, parameters, config):
        out = [p + float(step) * (1 + config["server_round"]) for p in parameters]
        return out, 10 + int(float(step)), {"round": config["server_round"]}

    def evaluate(self, parameters, config):
        seen.append([p.tolist() for p in parameters])
        return float(np.sum(parameters[0])), 5, {}

rounds = run_numpy_client(Client(), url, job, cid, token, timeout=120)
print(json.dumps({
    "flwr": flwr.__version__,
    "numpy_client": NumPyClient.__module__,
    "rounds": [[r.round, r.fit_examples, r.error is None] for r in rounds],
    "seen": seen,
}))
"""


@pytest.fixture(scope="module")
def platform(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str], str]]:
    """A control plane process over two real node gateways: (its URL, gateways, secret)."""
    url = RedisURL(redis_server.url)
    url.server = redis_server
    tmp = tmp_path_factory.mktemp("flower-current")
    with realgw.real_gateways(url, tmp) as (urls, secret, _procs):
        admin = tmp / "admin-token"
        admin.write_text(secret)
        admin.chmod(0o600)
        port = free_port()
        settings = ControlPlaneSettings(
            port=port,
            gateways=",".join(f"{n}={u}" for n, u in urls.items()),
            admin_token_file=admin,
            mc=2.0,
            tick_s=0.05,
        )
        with open(tmp / "control-plane.log", "wb") as log:
            proc = subprocess.Popen(
                settings.to_argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )
        try:
            wait_for_port("127.0.0.1", port, 60, proc)
            yield f"http://127.0.0.1:{port}", urls, secret
        finally:
            stop_group(proc, 20)


def test_a_flower_142_numpy_client_trains_through_fedfaas_unchanged(
    platform: tuple[str, dict[str, str], str],
) -> None:
    cp, urls, secret = platform
    python = flower_python()
    w0 = [np.zeros(6, np.float32), np.zeros((2, 3), np.float32)]
    with httpx.Client(base_url=cp, headers=bearer(secret), timeout=60) as api:
        r = api.post(
            "/v1/jobs",
            json={
                "job": "flower-current",
                "rounds": 2,
                "goal": 2,
                "clients": 2,
                "overprovision": 1.0,
                "weights_b64": base64.b64encode(flower_weights(w0)).decode(),
            },
        )
        assert r.status_code == 201, r.text
        tokens: dict[str, str] = r.json()["tokens"]
        procs = {
            c: subprocess.Popen(
                [str(python), "-c", CLIENT, cp, "flower-current", c, tokens[c], str(k + 1)],
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
                cwd="/",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k, c in enumerate(sorted(tokens))
        }
        outs = {}
        for c, p in procs.items():
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
            outs[c] = json.loads(out.strip().splitlines()[-1])
        view = api.get("/v1/jobs/flower-current").json()
    assert view["done"] and view["completed"] == 2, view
    for k, c in enumerate(sorted(tokens)):
        got = outs[c]
        assert got["flwr"] == FLOWER_VERSION
        assert got["numpy_client"].startswith("flwr.")  # Flower's own class, not a stand-in
        assert got["rounds"] == [[1, 11 + k, True], [2, 11 + k, True]]
    # round r: client k fits  w_{r-1} + (k + 1)(1 + r), weighted by 11 + k
    w = np.zeros(6)
    for r in (1, 2):
        for c in sorted(tokens):  # evaluate saw the model the round started from
            assert np.allclose(outs[c]["seen"][r - 1][0], w, atol=1e-5)
        w = sum((11 + k) * (w + (k + 1) * (1 + r)) for k in range(2)) / (11 + 12)
    m = httpx.get(f"{urls['n1']}/v1/jobs/flower-current/model", headers=bearer(secret))
    final = load(m.content)
    assert np.allclose(final["00000"], w, atol=1e-4), (final["00000"], w)
    assert final["00001"].shape == (2, 3)


def test_the_flower_environment_is_flowers_newest_and_separate_from_the_platforms() -> None:
    python = flower_python()
    out = subprocess.run(
        [str(python), "-c", "import flwr, fastapi, sys; print(flwr.__version__, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    assert out[0] == FLOWER_VERSION
    assert Path(out[1]) != Path(sys.prefix)  # not the platform's environment
