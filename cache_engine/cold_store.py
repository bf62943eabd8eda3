"""The cold store: every round of every job in MinIO, the copy of record behind the cache.

Layout (bucket ``fedfaas``, that of :mod:`core.checkpoints`; rounds zero-padded to 6 digits)::

    <job>/rounds/<round:06d>/global.safetensors        global model after the round (0: initial)
    <job>/rounds/<round:06d>/clients/<client>.safetensors   client updates (full model weights)
    <job>/rounds/<round:06d>/meta.json                 written last: a round is complete once its
                                                       meta.json exists

meta.json comes from several writers; :func:`normalize_meta` reads all of them: FLStore's own
``{"round", "clients": [ids], "client_meta": {id: {...}}, "round_meta": {...}}``, the gateway's
``{"clients": {id: weight}, "count", "weight_sum", ...}`` and the demo's ``{"clients": [{"client",
"num_samples", ...}], "accuracy", "loss", "seconds", ...}``.

Updates and globals are safetensors of full model weights; :func:`flatten` turns them into one
float32 vector in canonical order (tensor names sorted), the layout workloads compute on.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from cache_engine.keys import ObjectKey

log = logging.getLogger(__name__)
#: what :meth:`ColdStore.header` reads of an object at first (a model's header fits)
HEAD_BYTES = 64 << 10

BUCKET = "fedfaas"


class ColdStoreError(RuntimeError):
    """The cold store failed or lacks an object."""


class ObjectMissing(ColdStoreError):
    """An object is not in the cold store."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no object {path} in the cold store")
        self.path = path


def object_path(key: ObjectKey) -> str:
    """Path of ``key``'s object inside the bucket (the checkpoint layout)."""
    from core.checkpoints import client_key, global_key, meta_key

    if key.kind == "update":
        return client_key(key.job, key.round, key.client)
    if key.kind == "global":
        return global_key(key.job, key.round)
    return meta_key(key.job, key.round)


_ROUND_FIELDS = {"seconds": "duration_s"}


def normalize_meta(doc: dict[str, Any]) -> dict[str, Any]:
    """Any writer's meta.json -> ``{"round", "clients", "client_meta", "round_meta"}``."""
    raw = doc.get("clients")
    client_meta: dict[str, dict[str, Any]] = {
        str(c): dict(m) for c, m in (doc.get("client_meta") or {}).items()
    }
    if isinstance(raw, dict):  # gateway: {client: weight (sample count)}
        for c, w in raw.items():
            client_meta.setdefault(str(c), {}).setdefault("n_samples", w)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and "client" in item:  # demo: [{client, num_samples}]
                m = client_meta.setdefault(str(item["client"]), {})
                for k, v in item.items():
                    if k != "client":
                        m.setdefault("n_samples" if k == "num_samples" else k, v)
    clients = sorted(str(c) for c in raw if isinstance(c, str)) if isinstance(raw, list) else []
    clients = sorted(set(clients) | set(client_meta))
    round_meta = dict(doc.get("round_meta") or {})
    for k, v in doc.items():
        if k not in ("clients", "client_meta", "round_meta") and not isinstance(v, (dict, list)):
            round_meta.setdefault(_ROUND_FIELDS.get(k, k), v)
    return {
        "round": doc.get("round"),
        "clients": clients,
        "client_meta": client_meta,
        "round_meta": round_meta,
    }


def flatten(tensors: Mapping[str, NDArray[Any]]) -> NDArray[np.float32]:
    """Concatenate ``tensors`` as float32 in sorted-name order (one flat vector)."""
    names = sorted(tensors)
    total = sum(int(np.asarray(tensors[n]).size) for n in names)
    out = np.empty(total, dtype=np.float32)
    off = 0
    for n in names:
        a = np.asarray(tensors[n]).reshape(-1)
        out[off : off + a.size] = a
        off += a.size
    return out


def decode_object(key: ObjectKey, data: bytes) -> NDArray[np.float32] | dict[str, Any]:
    """Bytes of ``key``'s object -> flat float32 vector (models) or a dict (metadata)."""
    if key.kind == "meta":
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ColdStoreError(f"{object_path(key)} is not a JSON object")
        return normalize_meta(obj)
    return flatten(st_load(data))


_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
}


class TensorIndex:
    """Where the tensors of a safetensors object lie, in the flat vector and in the file.

    Parameters
    ----------
    tensors
        ``(name, dtype, first byte, end byte)`` in :func:`flatten`'s order (sorted names),
        byte offsets from the start of the file.
    shapes
        Each tensor's shape, in the same order.
    """

    def __init__(
        self,
        tensors: list[tuple[str, np.dtype[Any], int, int]],
        shapes: list[tuple[int, ...]] | None = None,
    ) -> None:
        self.tensors = tensors
        self.shapes = shapes or [((hi - lo) // dt.itemsize,) for _, dt, lo, hi in tensors]
        sizes = [(hi - lo) // dt.itemsize for _, dt, lo, hi in tensors]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    @property
    def numel(self) -> int:
        return int(self.starts[-1])

    def layout(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The tensors' names and shapes (``cache_engine.evaluators.Layout``)."""
        return tuple((t[0], s) for t, s in zip(self.tensors, self.shapes, strict=True))

    @classmethod
    def parse(cls, header: bytes, data_offset: int) -> TensorIndex:
        try:
            doc = json.loads(header)
            out = []
            shapes = []
            for name in sorted(k for k in doc if k != "__metadata__"):
                t = doc[name]
                dtype = _DTYPES.get(t["dtype"])
                if dtype is None:  # BF16 and the rest: :func:`flatten` reads those whole
                    raise ColdStoreError(f"tensor {name}: no ranged reads of {t['dtype']}")
                lo, hi = (int(x) for x in t["data_offsets"])
                out.append((name, dtype, data_offset + lo, data_offset + hi))
                shapes.append(tuple(int(d) for d in t["shape"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ColdStoreError(f"not a safetensors header: {exc}") from None
        return cls(out, shapes)

    def flat_start(self) -> int | None:
        """The file's byte of coordinate 0 where every tensor is float32 and follows the one
        before it in the file (coordinate ``c`` at byte ``flat_start() + 4 c``), else None."""
        end = self.tensors[0][2] if self.tensors else None
        for _, dtype, lo, hi in self.tensors:
            if dtype != np.float32 or lo != end:
                return None
            end = hi
        return self.tensors[0][2] if self.tensors else None

    def reads(self, start: int, stop: int) -> int:
        """The ranged reads :meth:`ColdStore.read_range` makes for coordinates
        ``[start, stop)``."""
        return len(_joined(self.pieces(start, stop)))

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int, np.dtype[Any]]]:
        """``(first byte, end byte, position in the output, dtype)`` of every tensor span that
        covers coordinates ``[start, stop)``."""
        if not 0 <= start <= stop <= self.numel:
            raise ColdStoreError(f"range [{start}, {stop}) outside a {self.numel}-float model")
        out = []
        for i, (_, dtype, lo, _) in enumerate(self.tensors):
            a, b = int(self.starts[i]), int(self.starts[i + 1])
            x, y = max(a, start), min(b, stop)
            if x < y:
                out.append(
                    (lo + (x - a) * dtype.itemsize, lo + (y - a) * dtype.itemsize, x - start, dtype)
                )
        return out


def _joined(
    pieces: list[tuple[int, int, int, np.dtype[Any]]],
) -> list[tuple[int, int, int, np.dtype[Any]]]:
    """Tensor spans of :meth:`TensorIndex.pieces` that follow each other in the file and in the
    output, with one dtype, as one span (one ranged read instead of several)."""
    out: list[tuple[int, int, int, np.dtype[Any]]] = []
    for lo, hi, dst, dtype in pieces:
        if out:
            plo, phi, pdst, pdtype = out[-1]
            if pdtype == dtype and phi == lo and pdst + (phi - plo) // dtype.itemsize == dst:
                out[-1] = (plo, hi, pdst, dtype)
                continue
        out.append((lo, hi, dst, dtype))
    return out


def encode_model(tensors: Mapping[str, NDArray[Any]]) -> bytes:
    """Safetensors bytes of ``tensors`` (never pickle)."""
    return st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()})


class ColdStore(ABC):
    """Read (and, for writers and tests, write) objects of the cold store."""

    @abstractmethod
    def get_bytes(self, key: ObjectKey) -> bytes:
        """Raw bytes of ``key``'s object; raises :class:`ObjectMissing`."""

    @abstractmethod
    def put_bytes(self, key: ObjectKey, data: bytes) -> None:
        """Store ``data`` as ``key``'s object."""

    @abstractmethod
    def rounds(self, job: str) -> list[int]:
        """Complete rounds of ``job`` (those with a meta.json), ascending."""

    @abstractmethod
    def jobs(self) -> list[str]:
        """Jobs with at least one object."""

    def client_ids(self, job: str, rnd: int) -> list[str]:
        """Clients with an update object stored for round ``rnd`` (listing, not metadata)."""
        return list(self.round_meta(job, rnd)["clients"])

    def size(self, key: ObjectKey) -> int:
        """Stored size of ``key``'s object in bytes (about its size in memory for models)."""
        return len(self.get_bytes(key))

    def job_credentials(self, jobs: set[str]) -> dict[str, dict[str, Any]]:
        """Temporary credentials that read only ``job``'s objects, by job, for a cache function
        to load them with (:class:`MinioColdStore`); none for a store without users."""
        return {}

    def get_bytes_range(self, key: ObjectKey, offset: int, length: int) -> bytes:
        """``length`` bytes of ``key``'s object from ``offset`` (a ranged read)."""
        return self.get_bytes(key)[offset : offset + length]

    def header(self, key: ObjectKey) -> TensorIndex:
        """Where each tensor of a model's safetensors object lies: one ranged read of its
        first :data:`HEAD_BYTES` (a second one for a header longer than that)."""
        head = self.get_bytes_range(key, 0, HEAD_BYTES)
        if len(head) < 8:
            raise ColdStoreError(f"{object_path(key)} is shorter than a safetensors header")
        n = int.from_bytes(head[:8], "little")
        if n > 100 << 20:
            raise ColdStoreError(f"{object_path(key)}: a safetensors header of {n} bytes")
        doc = head[8 : 8 + n] if 8 + n <= len(head) else self.get_bytes_range(key, 8, n)
        return TensorIndex.parse(doc, 8 + n)

    def read_range(
        self,
        key: ObjectKey,
        start: int,
        stop: int,
        index: TensorIndex | None = None,
        out: NDArray[np.float32] | None = None,
    ) -> NDArray[np.float32]:
        """Coordinates ``[start, stop)`` of a model's flat vector (:func:`flatten`'s order),
        read by ranges: only those bytes leave the store (``index``: its :meth:`header`;
        ``out``: a float32 buffer of ``stop - start`` to fill, reused by a caller that streams
        chunk after chunk; a new array otherwise)."""
        index = index or self.header(key)
        if out is None:
            out = np.empty(max(0, stop - start), dtype=np.float32)
        elif (
            out.shape != (max(0, stop - start),)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
        ):
            raise ValueError(
                f"out must be {stop - start} contiguous float32, not {out.shape} {out.dtype}"
            )
        for lo, hi, dst, dtype in _joined(index.pieces(start, stop)):
            n = (hi - lo) // dtype.itemsize
            if dtype == np.float32:  # straight into the output, no copy in between
                self.read_into(key, lo, out[dst : dst + n].data.cast("B"))
                continue
            raw = self.get_bytes_range(key, lo, hi - lo)
            if len(raw) != hi - lo:
                raise ColdStoreError(f"{object_path(key)} ended early (a ranged read)")
            out[dst : dst + n] = np.frombuffer(raw, dtype)
        return out

    def read_into(self, key: ObjectKey, offset: int, out: memoryview) -> None:
        """``len(out)`` bytes of ``key``'s object from ``offset``, written into ``out``."""
        raw = self.get_bytes_range(key, offset, len(out))
        if len(raw) != len(out):
            raise ColdStoreError(f"{object_path(key)} ended early (a ranged read)")
        out[:] = raw

    def get(self, key: ObjectKey) -> NDArray[np.float32] | dict[str, Any]:
        """Decoded object (see :func:`decode_object`)."""
        return decode_object(key, self.get_bytes(key))

    def round_meta(self, job: str, rnd: int) -> dict[str, Any]:
        obj = self.get(ObjectKey(job, rnd, "meta"))
        assert isinstance(obj, dict)
        return obj

    def write_round(
        self,
        job: str,
        rnd: int,
        updates: Mapping[str, Mapping[str, NDArray[Any]]],
        global_weights: Mapping[str, NDArray[Any]] | None,
        client_meta: Mapping[str, Mapping[str, Any]] | None = None,
        round_meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Write a complete round: updates, global model, then meta.json last."""
        for c, t in updates.items():
            self.put_bytes(ObjectKey(job, rnd, "update", c), encode_model(t))
        if global_weights is not None:
            self.put_bytes(ObjectKey(job, rnd, "global"), encode_model(global_weights))
        doc = {
            "round": rnd,
            "clients": sorted(updates),
            "client_meta": {c: dict(m) for c, m in (client_meta or {}).items()},
            "round_meta": dict(round_meta or {}),
        }
        self.put_bytes(ObjectKey(job, rnd, "meta"), json.dumps(doc).encode())


class MinioColdStore(ColdStore):
    """:class:`ColdStore` on a real MinIO (or any S3) through the ``minio`` client.

    Parameters
    ----------
    endpoint
        ``host:port``.
    access_key, secret_key, session_token
        Credentials (a session token with temporary ones, see :meth:`job_credentials`).
    bucket
        Bucket name (created if missing when ``create`` is true).
    """

    #: lifetime of the credentials :meth:`job_credentials` mints (MinIO's minimum)
    GRANT_SECONDS = 900
    #: a minted grant is handed out again while it has at least this long left
    GRANT_REUSE_SECONDS = 600

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str = BUCKET,
        *,
        session_token: str | None = None,
        secure: bool = False,
        create: bool = True,
    ) -> None:
        from minio import Minio

        from core.checkpoints import retrying_http

        self.endpoint = endpoint
        self.bucket = bucket
        self.secure = secure
        self._keys = (access_key, secret_key)
        self._grants: dict[str, dict[str, Any]] = {}
        self._grants_lock = threading.Lock()
        # region given: no GetBucketLocation call, which a one-job grant is not allowed
        self.client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            secure=secure,
            region="us-east-1",
            http_client=retrying_http(),  # never a minute asleep on MinIO's Retry-After
        )
        if create and not self.client.bucket_exists(bucket):
            try:
                self.client.make_bucket(bucket)
            except Exception as exc:  # a concurrent creator won the race
                if not self.client.bucket_exists(bucket):
                    raise ColdStoreError(f"cannot create bucket {bucket}: {exc}") from exc

    def get_bytes(self, key: ObjectKey) -> bytes:
        return self._get(key)

    def get_bytes_range(self, key: ObjectKey, offset: int, length: int) -> bytes:
        return self._get(key, offset, length) if length > 0 else b""

    def read_into(self, key: ObjectKey, offset: int, out: memoryview) -> None:
        if not len(out):
            return
        with self._response(key, offset, len(out)) as resp:
            got = 0
            while got < len(out):
                n = resp.readinto(out[got:])
                if not n:
                    raise ColdStoreError(f"{object_path(key)} ended early (a ranged read)")
                got += n

    def _get(self, key: ObjectKey, offset: int = 0, length: int = 0) -> bytes:
        """The object's bytes (``length`` of them from ``offset``; 0: to the end)."""
        with self._response(key, offset, length) as resp:
            return bytes(resp.read())

    @contextlib.contextmanager
    def _response(self, key: ObjectKey, offset: int, length: int) -> Iterator[Any]:
        """MinIO's response to a GET of ``key`` (``length`` bytes from ``offset``; 0: to the
        end), its connection given back after."""
        from minio.error import S3Error

        path = object_path(key)
        try:
            resp = self.client.get_object(self.bucket, path, offset=offset, length=length)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchBucket"):
                raise ObjectMissing(path) from None
            where = f" [{offset}+{length}]" if length else ""
            raise ColdStoreError(f"minio get {path}{where}: {exc.code}") from exc
        try:
            yield resp
        finally:
            resp.close()
            resp.release_conn()

    def client_ids(self, job: str, rnd: int) -> list[str]:
        prefix = object_path(ObjectKey(job, rnd, "meta")).rsplit("/", 1)[0] + "/clients/"
        return sorted(
            o.object_name[len(prefix) :].removesuffix(".safetensors")
            for o in self.client.list_objects(self.bucket, prefix=prefix)
            if o.object_name.endswith(".safetensors")
        )

    def size(self, key: ObjectKey) -> int:
        from minio.error import S3Error

        try:
            return int(self.client.stat_object(self.bucket, object_path(key)).size or 0)
        except S3Error as exc:
            raise ObjectMissing(object_path(key)) from exc

    def job_credentials(self, jobs: set[str]) -> dict[str, dict[str, Any]]:
        """Per job, temporary credentials (MinIO ``AssumeRole``, :attr:`GRANT_SECONDS`) whose
        session policy allows ``s3:GetObject`` on ``<bucket>/<job>/*`` and nothing else:
        ``{"access_key", "secret_key", "session_token", "expires"}`` (``expires``: Unix
        seconds). A grant is reused while it has :attr:`GRANT_REUSE_SECONDS` left."""
        return {job: self._grant(job) for job in sorted(jobs)}

    def _grant(self, job: str) -> dict[str, Any]:
        from minio.credentials.providers import AssumeRoleProvider

        with self._grants_lock:
            g = self._grants.get(job)
            if g is not None and g["expires"] - time.time() > self.GRANT_REUSE_SECONDS:
                return g
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{self.bucket}/{job}/*"],
                }
            ],
        }
        scheme = "https" if self.secure else "http"
        t0 = time.time()
        try:
            c = AssumeRoleProvider(
                sts_endpoint=f"{scheme}://{self.endpoint}",
                access_key=self._keys[0],
                secret_key=self._keys[1],
                duration_seconds=self.GRANT_SECONDS,
                policy=json.dumps(policy),
            ).retrieve()
        except Exception as exc:
            raise ColdStoreError(f"cannot mint read credentials for job {job}: {exc}") from exc
        g = {
            "access_key": c.access_key,
            "secret_key": c.secret_key,
            "session_token": c.session_token,
            "expires": t0 + self.GRANT_SECONDS,
        }
        with self._grants_lock:
            self._grants[job] = g
        return g

    def put_bytes(self, key: ObjectKey, data: bytes) -> None:
        path = object_path(key)
        self.client.put_object(
            self.bucket,
            path,
            io.BytesIO(data),
            len(data),
            content_type="application/json" if key.kind == "meta" else "application/octet-stream",
        )

    def rounds(self, job: str) -> list[int]:
        out = []
        for obj in self.client.list_objects(self.bucket, prefix=f"{job}/rounds/"):
            name = obj.object_name.rstrip("/").rsplit("/", 1)[-1]
            if name.isdigit():
                try:
                    self.client.stat_object(
                        self.bucket, object_path(ObjectKey(job, int(name), "meta"))
                    )
                except Exception:
                    continue
                out.append(int(name))
        return sorted(out)

    def jobs(self) -> list[str]:
        return sorted(o.object_name.rstrip("/") for o in self.client.list_objects(self.bucket))


class MemoryColdStore(ColdStore):
    """A cold store in a dict (unit tests of pure logic only)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def get_bytes(self, key: ObjectKey) -> bytes:
        path = object_path(key)
        try:
            return self.objects[path]
        except KeyError:
            raise ObjectMissing(path) from None

    def put_bytes(self, key: ObjectKey, data: bytes) -> None:
        self.objects[object_path(key)] = bytes(data)

    def client_ids(self, job: str, rnd: int) -> list[str]:
        prefix = object_path(ObjectKey(job, rnd, "meta")).rsplit("/", 1)[0] + "/clients/"
        return sorted(
            p[len(prefix) :].removesuffix(".safetensors")
            for p in self.objects
            if p.startswith(prefix)
        )

    def rounds(self, job: str) -> list[int]:
        return sorted(
            int(p.split("/")[2])
            for p in self.objects
            if p.startswith(f"{job}/rounds/") and p.endswith("/meta.json")
        )

    def jobs(self) -> list[str]:
        return sorted({p.split("/", 1)[0] for p in self.objects})
