"""The shard manifest: what a SHARD frame's object tells an aggregator endpoint to compute.

A round whose rule needs every update at once (``core.robust``) runs as S coordinate shards,
each a task for one ``aggregator`` endpoint. A frame carries one key, so the gateway writes a
manifest object (a plain file in the job's store folder, outside the pool) that every shard of a
pass reads; the SHARD frame names it, the shard's index in ``seq`` and the pass in ``flags``::

    [ 0: b"FFSHARD1" | 8: u64 JSON length | 16: u64 offset of the results | 24..63: zero ]
    [ 64: the pass as JSON ]
    [ results: S x n x n float64 (the Gram pass: each shard writes its own n x n block) ]

The JSON names the rule, the input keys (the round's updates, in one order), the model the round
started from (``global``), the output object (``out``: each reducing shard writes its range of it,
so the top's stitching is an offset, not a copy), the shard boundaries (float32 coordinates of
the data region) and, for a linear pass, the coefficients and DP-FedAvg's noise (its standard
deviation and the round's seed: the manifest lives in the node's shared memory, readable by the
job's endpoints only, and is freed with the round). Pure: no I/O.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.robust import Noise

MAGIC = b"FFSHARD1"
_HEAD = struct.Struct("<8sQQ")
HEAD_SIZE = 64

#: the passes (a SHARD frame's ``flags``)
GRAM = 1  # each shard: the Gram matrix of the deltas over its range
ORDER = 2  # each shard: median or trimmed mean over its range
LINEAR = 3  # each shard: g + sum_i c_i (u_i - g) over its range
PASSES = {GRAM: "gram", ORDER: "order", LINEAR: "linear"}


@dataclass(frozen=True)
class Pass:
    """One pass of a sharded round, as its manifest says."""

    kind: int
    rule: dict[str, Any]
    inputs: list[bytes]
    global_key: bytes
    out_key: bytes
    bounds: list[int]
    coef: list[float]
    #: a linear pass's Gaussian noise (DP-FedAvg), None for none
    noise: Noise | None = None

    @property
    def shards(self) -> int:
        return len(self.bounds) - 1

    def doc(self) -> bytes:
        return json.dumps(
            {
                "pass": PASSES[self.kind],
                "rule": self.rule,
                "inputs": [k.hex() for k in self.inputs],
                "global": self.global_key.hex(),
                "out": self.out_key.hex(),
                "bounds": self.bounds,
                "coef": self.coef,
                "noise": None
                if self.noise is None
                else {"std": self.noise.std, "seed": str(self.noise.seed)},
            },
            separators=(",", ":"),
        ).encode()

    def nbytes(self) -> int:
        """Size of the manifest object for this pass."""
        return _results_offset(len(self.doc())) + self._results_nbytes()

    def _results_nbytes(self) -> int:
        n = len(self.inputs)
        return self.shards * n * n * 8 if self.kind == GRAM else 0

    def write(self, buf: memoryview) -> None:
        doc = self.doc()
        off = _results_offset(len(doc))
        buf[:HEAD_SIZE] = _HEAD.pack(MAGIC, len(doc), off).ljust(HEAD_SIZE, b"\0")
        buf[HEAD_SIZE : HEAD_SIZE + len(doc)] = doc


def _results_offset(doc_len: int) -> int:
    return -(-(HEAD_SIZE + doc_len) // 64) * 64


def read(buf: memoryview) -> Pass:
    """The pass a manifest object describes; ``ValueError`` when it is not one."""
    magic, doc_len, _ = _HEAD.unpack_from(buf)
    if magic != MAGIC or HEAD_SIZE + doc_len > len(buf):
        raise ValueError("not a shard manifest")
    raw = json.loads(bytes(buf[HEAD_SIZE : HEAD_SIZE + doc_len]))
    kinds = {v: k for k, v in PASSES.items()}
    return Pass(
        kinds[raw["pass"]],
        dict(raw["rule"]),
        [bytes.fromhex(k) for k in raw["inputs"]],
        bytes.fromhex(raw["global"]),
        bytes.fromhex(raw["out"]),
        [int(b) for b in raw["bounds"]],
        [float(c) for c in raw["coef"]],
        None
        if raw.get("noise") is None
        else Noise(float(raw["noise"]["std"]), int(raw["noise"]["seed"])),
    )


def results(buf: memoryview, p: Pass) -> NDArray[np.float64]:
    """The Gram pass's result area, ``(S, n, n)`` float64, a view of the manifest."""
    _, _, off = _HEAD.unpack_from(buf)
    n = len(p.inputs)
    return np.frombuffer(buf, dtype=np.float64, count=p.shards * n * n, offset=off).reshape(
        p.shards, n, n
    )
