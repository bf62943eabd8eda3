"""Issue 41's must-show: secure aggregation end to end on ``fedfaas up --with all``.

10 clients, 3 rounds, 2 nodes: each client runs the SDK's participant
(:class:`client.secure.SecureRound`) against the control plane's stage routes and its node
gateway; the aggregators fold the masked vectors in Z_2^32; the job's root gateway unmasks and
publishes. Each round's published model is exactly the dequantized sum of the clients'
quantized updates (what :mod:`core.secagg.quantize` makes of them, computed here from the
plain updates), within the quantization's bound of their weighted FedAvg. In round 2, 2 of
the 10 clients stop after their masked upload, before unmasking: the round completes, exact.
Every update and partial sum seen in the nodes' object stores while the rounds ran is
chi-square uniform, and no client update of the job reaches MinIO (its ``clients/``
objects, FLStore's input).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from client.sdk import submit_job
from client.secure import SecureRound, flatten, unflatten
from core import wire
from core.objstore.arena import ENTRY, ENTRY_SIZE, HEADER, HEADER_SIZE, SEALED
from core.secagg import masks, quantize
from core.secagg.config import SecAggConfig
from fedfaas.platform import credentials, state
from tests.platform.running import any_ports_env, running_platform
from tests.secagg.rounds import UNIFORM_P, looks_uniform

pytestmark = [pytest.mark.slow, pytest.mark.integration]

N, ROUNDS = 10, 3
CLIENTS = [f"c{i}" for i in range(N)]
#: round -> the clients that stop after their masked upload, before unmasking
STOP_BEFORE_UNMASK = {2: {"c3", "c7"}}
SHAPES = {"dense.weight": (50, 60), "dense.bias": (60,), "out.weight": (60, 10)}
# a stage timeout long enough for 10 client threads on a loaded 2-core machine: the unmask
# stage does not wait it out for the two that stop (the shares in hand rebuild every seed)
SPEC = {"neighbours": 6, "clip": 1.0, "bits": 16, "stage_timeout_s": 30.0}
CONFIG = SecAggConfig.from_spec(SPEC)


class StoreWatch:
    """Reads every sealed update and partial in the nodes' arenas while the rounds run."""

    def __init__(self, shm: Path, job: str, nbytes: int) -> None:
        self.shm, self.job, self.nbytes = shm, job, nbytes
        self.seen: dict[bytes, bytes] = {}  # object key -> its data region
        self.kinds: dict[bytes, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StoreWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for arena in self.shm.glob(f"**/{self.job}/.arena"):
                try:
                    self._read(arena)
                except OSError:
                    continue
            self._stop.wait(0.02)

    def _read(self, arena: Path) -> None:
        data = arena.read_bytes()
        _, _, slots, object_nbytes, stride, data_off = HEADER.unpack_from(data, 0)
        for i in range(slots):
            key, st, _ = ENTRY.unpack_from(data, HEADER_SIZE + i * ENTRY_SIZE)
            if st != SEALED or key in self.seen:
                continue
            obj = data[data_off + i * stride : data_off + i * stride + object_nbytes]
            try:
                h = wire.read_header(obj)
            except wire.WireError:
                continue  # freed meanwhile
            if h.kind in (wire.KIND_UPDATE, wire.KIND_PARTIAL):
                # the masked vector, not the zero padding that ends the object
                self.seen[key] = obj[wire.HEADER_SIZE : wire.HEADER_SIZE + self.nbytes]
                self.kinds[key] = h.kind


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.PlatformState]:
    env = any_ports_env()
    state_dir = tmp_path_factory.mktemp("secagg-platform") / "state"
    with running_platform(state_dir, "--with", "all", env=env, timeout=300) as st:
        yield st


def _update(rnd: int, i: int) -> tuple[dict[str, np.ndarray], int]:
    rng = np.random.default_rng(1000 * rnd + i)
    update = {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in SHAPES.items()}
    return update, int(rng.integers(20, 400))


def _take_part(job: object, client: str, rnd: int) -> tuple[np.ndarray, int, str]:
    """``client``'s round: the model it trains on checked, its update masked and uploaded,
    its shares sent (unless it stops before unmasking); its flat update, sample count and
    node."""
    i = CLIENTS.index(client)
    update, n = _update(rnd, i)
    part = SecureRound(job, client, rnd, timeout=240)  # type: ignore[arg-type]
    with part.fl:
        model = part.model()
        assert {k: v.shape for k, v in model.items()} == SHAPES
        part.advertise()
        part.share_keys()
        part.upload(update, n)
        if client not in STOP_BEFORE_UNMASK.get(rnd, set()):
            part.unmask()
    return flatten(update), n, part.fl.assignment.node


def test_ten_clients_three_rounds_two_nodes_published_fedavg_exact_stores_uniform(
    platform: state.PlatformState,
) -> None:
    st = platform
    urls = {name: f"http://{st.host}:{port}" for name, port in st.ports.items()}
    secrets = Path(st.state_dir) / "secrets"
    admin = (secrets / "gateway-admin-secret").read_text().strip()
    initial = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    job = submit_job(
        urls["control_plane"],
        "private",
        save(initial),
        rounds=ROUNDS,
        clients=CLIENTS,
        admin_token=admin,
        policy="leastconn",
        per_leaf=3,
        secure_aggregation=SPEC,
        deadline_s=300,
    )
    [shm] = {rec.extra["shm"] for rec in st.services if "shm" in rec.extra}
    length = sum(int(np.prod(s)) for s in SHAPES.values()) + 1  # the weight word last
    with StoreWatch(Path(shm), "private", 4 * length) as watch:
        for rnd in range(1, ROUNDS + 1):
            with ThreadPoolExecutor(N) as pool:
                sent = list(pool.map(lambda c, r=rnd: _take_part(job, c, r), CLIENTS))
            job.wait(rnd, timeout=240)
            quantized = np.zeros(sent[0][0].size + 1, np.uint32)
            assert {node for _, _, node in sent} == {"node0", "node1"}  # both nodes fold
            for update, n, _ in sent:
                masks.add(quantized, quantize.quantize(CONFIG, update, n))
            want = quantize.dequantize(CONFIG, quantized, N)
            got = unflatten(job.model(version=rnd).data)
            got_flat = flatten(got)
            np.testing.assert_array_equal(got_flat, want)  # exact: the same arithmetic
            weights = np.array([quantize.weight_ratio(CONFIG, n) for _, n, _ in sent])
            clipped = np.stack([np.clip(u, -CONFIG.clip, CONFIG.clip) for u, _, _ in sent])
            fedavg = (weights[:, None] * clipped).sum(0) / weights.sum()
            bound = quantize.error_bound(CONFIG, N, float(quantized[-1]) / CONFIG.levels)
            assert np.abs(got_flat - fedavg).max() <= bound
    updates = [k for k, kind in watch.kinds.items() if kind == wire.KIND_UPDATE]
    assert len(updates) >= N  # at least a round's worth caught in the stores
    for key, data in watch.seen.items():
        assert looks_uniform(data) > UNIFORM_P, key.hex()
    _assert_no_client_objects(urls["minio"], secrets)
    view = job.view()
    assert not view.get("failed") and len(job.history()) == ROUNDS, view


def _assert_no_client_objects(minio_url: str, secrets: Path) -> None:
    """The job's rounds are in MinIO (models, meta.json) but no client's update is."""
    from minio import Minio

    mc = Minio(
        minio_url.removeprefix("http://"),
        access_key=credentials.read(secrets, credentials.MINIO_USER),
        secret_key=credentials.read(secrets, credentials.MINIO_PASSWORD),
        secure=False,
    )
    names = [o.object_name for o in mc.list_objects("fedfaas", prefix="private/", recursive=True)]
    assert any(n.endswith("global.safetensors") for n in names), names
    assert not [n for n in names if "/clients/" in n], names
