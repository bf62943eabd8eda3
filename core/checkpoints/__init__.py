"""Asynchronous checkpoints to MinIO: global models, client updates and round metadata.

Layout (one bucket, ``fedfaas`` by default, browsable in the MinIO console)::

    <job>/rounds/<round:06d>/global.safetensors      (user metadata: the put_global meta)
    <job>/rounds/<round:06d>/clients/<client>.safetensors
    <job>/rounds/<round:06d>/meta.json
    <job>/rounds/<round:06d>/server_opt.safetensors   (jobs with a server optimizer: its state)

Rounds are zero-padded to six digits so that the console lists them in order; readers parse
them with ``int``. :class:`CheckpointWriter` queues every object and uploads it from one
background thread, in order. Objects wait in memory up to ``memory_limit`` bytes and spill to
files in ``spool_dir`` beyond that, so the queue is bounded by disk, not memory. While MinIO is
down the head object is retried with exponential backoff (capped): an outage delays writes and
never drops them. Objects still queued at :meth:`CheckpointWriter.close` are spilled to the
spool folder, and a new writer on the same folder uploads them first.
"""

from core.checkpoints.keys import (
    DEFAULT_BUCKET,
    CheckpointClosed,
    CheckpointError,
    CheckpointNotFound,
    client_key,
    global_key,
    make_minio,
    meta_key,
    retrying_http,
    round_prefix,
    server_opt_key,
)
from core.checkpoints.reader import CheckpointReader
from core.checkpoints.writer import CheckpointWriter

__all__ = [
    "DEFAULT_BUCKET",
    "CheckpointClosed",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointReader",
    "CheckpointWriter",
    "client_key",
    "global_key",
    "make_minio",
    "meta_key",
    "retrying_http",
    "round_prefix",
    "server_opt_key",
]
