"""Secure aggregation from the client's side (SecAgg+, Bell et al. 2020)::

    job = submit_job(cp, "private", weights, rounds=3, goal=10, admin_token=secret,
                     clients=ids, secure_aggregation={"neighbours": 6, "clip": 1.0})
    # in each client, each round (all of a round's clients at once: the stages wait for them)
    rnd = SecureRound(job, "c0", round=1)
    model = rnd.model()                        # the last published FedAvg, as tensors
    rnd.run(train(model), num_samples=120)     # advertise, share keys, masked upload, unmask

The server sees only the sum of the round's updates: each client clips and quantizes its
update into Z_2^32, adds its self mask and one pairwise mask per neighbour, and uploads that
uint32 vector to its node gateway, whose aggregators fold the vectors in Z_2^32; the job's root
gateway removes the masks from the sum with the shares the survivors send and publishes the
dequantized FedAvg (within ``quantize.error_bound`` of the FedAvg of the clipped updates). The
control plane carries the stages (:mod:`control_plane.secagg_stages`).

A job with secure aggregation serves one float32 tensor, ``fedavg`` (the model's tensors in
name order, flattened): :func:`unflatten` (or :meth:`SecureRound.model`) gives the tensors
back from the layout the model carries. Its uploads are the clipped, weighted values
themselves: a model trained from weights outside ``[-clip, clip]`` should upload its change
(delta) and add the published mean itself.

The protocol's code is :mod:`core.secagg`. The light client wheel (``client/pyproject.toml``)
ships that package's files as ``client._secagg`` (its ``[secagg]`` extra brings
``cryptography`` and ``pycryptodome``), so a client needs neither the platform nor a copy:
in a checkout the same files are imported as ``core.secagg``.
"""

from __future__ import annotations

import importlib
import json
import logging
import struct
import time
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import load, save

from client.control import call
from client.errors import StageClosed, StageOpen
from client.node import GlobalModel, UploadReceipt


def _protocol(module: str) -> ModuleType:
    """``core.secagg.<module>`` in a checkout (or with the platform installed), else the same
    file shipped in the light client wheel as ``client._secagg.<module>``."""
    try:
        return importlib.import_module(f"core.secagg.{module}")
    except ModuleNotFoundError:
        return importlib.import_module(f"client._secagg.{module}")


if TYPE_CHECKING:
    from client.job import Job, RoundClient
    from core.secagg.config import LAYOUT_KEY, METADATA_KEY, SecAggConfig
    from core.secagg.messages import Advert, b64, context, unb64, unmask_to_json
    from core.secagg.participant import Participant
else:
    _config, _messages = _protocol("config"), _protocol("messages")
    LAYOUT_KEY, METADATA_KEY, SecAggConfig = (
        _config.LAYOUT_KEY,
        _config.METADATA_KEY,
        _config.SecAggConfig,
    )
    Advert, b64, context = _messages.Advert, _messages.b64, _messages.context
    unb64, unmask_to_json = _messages.unb64, _messages.unmask_to_json
    Participant = _protocol("participant").Participant

log = logging.getLogger(__name__)

#: the one tensor a job with secure aggregation serves (``gateway.secagg.SERVED_TENSOR``)
SERVED_TENSOR = "fedavg"
#: the one tensor its clients upload: the masked vector, the weight in its last word
MASKED_TENSOR = "masked"


def masked_initial_weights(initial_weights: bytes, secure_aggregation: Mapping[str, Any]) -> bytes:
    """The job's initial weights as a job with secure aggregation takes them: one uint32
    vector whose first words are the model's float32 values (its tensors in name order) and
    whose last is the weight word, with the parameters (``METADATA_KEY``) and the tensors'
    layout (``LAYOUT_KEY``) in its metadata. ``ValueError`` for parameters that cannot work
    (naming the field) or weights that are not float tensors."""
    cfg = SecAggConfig.from_spec(dict(secure_aggregation))
    tensors = load(bytes(initial_weights))
    bad = sorted(n for n, t in tensors.items() if t.dtype.kind != "f")
    if bad:
        raise ValueError(f"secure aggregation averages float tensors, not {', '.join(bad)}")
    names = sorted(tensors)
    flat = flatten({n: tensors[n] for n in names})
    vec = np.zeros(flat.size + 1, np.uint32)
    vec[:-1] = flat.view(np.uint32)
    layout = [[n, list(tensors[n].shape)] for n in names]
    metadata = {
        METADATA_KEY: json.dumps(cfg.to_spec(), sort_keys=True),
        LAYOUT_KEY: json.dumps(layout, separators=(",", ":")),
    }
    return bytes(save({MASKED_TENSOR: vec}, metadata=metadata))


def flatten(update: Mapping[str, Any] | np.ndarray) -> np.ndarray:
    """An update as the one float32 vector secure aggregation masks: a vector as it is, a
    state dict's tensors in name order."""
    if isinstance(update, np.ndarray):
        return np.ascontiguousarray(update, np.float32).reshape(-1)
    parts = [np.asarray(update[n], np.float32).reshape(-1) for n in sorted(update)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def metadata_of(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` map of safetensors bytes."""
    (n,) = struct.unpack_from("<Q", data, 0)
    meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}


def unflatten(data: bytes) -> dict[str, np.ndarray]:
    """A served model (safetensors bytes of ``fedavg``) as the job's tensors, from the layout
    its metadata carries."""
    layout = json.loads(metadata_of(data)[LAYOUT_KEY])
    flat = load(data)[SERVED_TENSOR]
    out, at = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape, dtype=np.int64))
        out[str(name)] = flat[at : at + size].reshape(shape)
        at += size
    if at != flat.size:
        raise ValueError(f"the model has {flat.size} values, its layout {at}")
    return out


class SecureRound:
    """Client ``client``'s part in round ``round`` of a job with secure aggregation.

    Each step waits for the stage before it to close on the control plane (asking again
    every ``poll`` s, at most ``timeout`` s in all); a client that stops between steps is
    dropped by the round, which goes on without it while enough remain (the job's
    ``threshold``).
    """

    def __init__(
        self, job: Job, client: str, round: int, *, poll: float = 0.2, timeout: float = 300.0
    ) -> None:
        self.job, self.client, self.round = job, client, round
        self.poll, self.deadline = poll, time.monotonic() + timeout
        self.token = job.token_of(client)
        self.fl: RoundClient = job.client(client, round=round, timeout=timeout)
        self._model = self.fl.fetch_model()
        cfg = SecAggConfig.from_spec(json.loads(metadata_of(self._model.data)[METADATA_KEY]))
        self.participant = Participant(cfg, client, context(job.name, round))

    @property
    def served(self) -> GlobalModel:
        """The model this round's clients train on, as the gateway serves it."""
        return self._model

    def model(self) -> dict[str, np.ndarray]:
        """The model this round's clients train on, as the job's tensors."""
        return unflatten(self._model.data)

    def _path(self, stage: str) -> str:
        return f"/v1/jobs/{self.job.name}/rounds/{self.round}/secagg/{stage}"

    def _call(self, method: str, stage: str, body: Any = None) -> dict[str, Any]:
        """One stage call; a stage still open is asked again until the deadline."""
        while True:
            try:
                resp = call(
                    method,
                    self.job.url,
                    self._path(stage),
                    self.token,
                    timeout=self.job.timeout,
                    transport=self.job.transport,
                    params={"client": self.client},
                    json=body,
                )
                return dict(resp.json())
            except StageOpen:
                if time.monotonic() > self.deadline:
                    raise
                time.sleep(self.poll)

    def advertise(self) -> None:
        """Stage 1: this client's public keys and self-seed commitment."""
        self._call("POST", "advert", self.participant.advertise().to_json())

    def share_keys(self) -> None:
        """Stage 2: once every advert is in, this client's sealed shares for its neighbours."""
        roster = self._call("GET", "roster")["adverts"]
        adverts = {c: Advert.from_json(a) for c, a in roster.items()}
        envelopes = self.participant.share_keys(adverts)
        self._call("POST", "envelopes", {p: b64(e) for p, e in envelopes.items()})

    def upload(self, update: Mapping[str, Any] | np.ndarray, num_samples: int) -> UploadReceipt:
        """Stage 3: once every neighbour's envelope is in, the masked vector of ``update``
        (a state dict or a flat vector, the served model's values) to this client's gateway."""
        inbox = self._call("GET", "inbox")["envelopes"]
        sealed = {s: unb64(e, f"envelope from {s}", limit=512) for s, e in inbox.items()}
        vec = self.participant.masked_input(flatten(update), int(num_samples), sealed)
        return self.fl.upload(self.round, {MASKED_TENSOR: vec}, int(num_samples))

    def unmask(self) -> None:
        """Stage 4: once the round's masked sum is on the root, the shares that remove its
        masks (of the dropped clients' key seeds and the survivors' self seeds)."""
        try:
            req = self._call("GET", "unmask")
            s, b = self.participant.unmask(set(req["dropped"]), set(req["survivors"]))
            self._call("POST", "unmask", unmask_to_json(s, b))
        except StageClosed as exc:  # enough shares came without this client's, or the round
            # ended before this client got to it: nothing of its own is missing
            if exc.error != "stage_closed":  # not_in_sum (this client's update is in no
                # model of the round), unmask_failed, not_masked: the client must hear of it
                raise
            log.info("%s: round %d unmasked without its shares: %s", self.client, self.round, exc)

    def run(self, update: Mapping[str, Any] | np.ndarray, num_samples: int) -> UploadReceipt:
        """The four stages in turn; the upload's receipt."""
        with self.fl:
            self.advertise()
            self.share_keys()
            receipt = self.upload(update, num_samples)
            self.unmask()
        return receipt
