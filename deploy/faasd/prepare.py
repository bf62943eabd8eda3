"""Install FedFaaS's services into a faasd working folder (``/var/lib/faasd`` on a faasd host).

::

    python deploy/faasd/prepare.py [--no-async] WORKDIR

Copies ``docker-compose.yaml``, ``prometheus.yml`` and ``wait-for.py`` (this folder's) into
WORKDIR, and writes what the compose services mount, relative to it:

- ``fedfaas/secrets/platform/`` (0700, root): every secret of the platform, made once and kept
  on later runs: the OpenFaaS basic auth (faasd's own ``secrets/basic-auth-*`` when faasd has
  made them, else written there for faasd to keep), MinIO's root, the components' MinIO and
  Redis users (``minio-<user>.json``, ``redis-<user>.json``, from
  :class:`core.services.MinioServer` and :class:`~core.services.RedisServer`), the
  gateways' admin secret, the admin, analyst, service and function tokens. The job owner reads
  ``gateway-admin-secret``, an analyst ``analyst-token``, from here.
- ``fedfaas/secrets/<service>/``: the files of one service only, owned by uid 12000 (the
  services' user), mode 0400, mounted read-only at ``/var/secrets`` (``function/`` holds
  ``fedfaas-function-token`` for the aggregator replicas, at ``/var/openfaas/secrets``).
- ``fedfaas/redis/redis.conf`` (the ACL users' SHA-256 only), ``fedfaas/minio/`` (MinIO's data),
  ``fedfaas/node<N>/{state,sockets}`` (each node gateway's spool and router socket folder).

``--no-async`` leaves NATS Streaming and the queue worker out of the installed compose file (and
the gateway's NATS settings): asynchronous invocations are then off, everything synchronous
works. Idempotent; run it again after changing a secret in ``fedfaas/secrets/platform``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import yaml

from core.services import MinioServer, RedisServer
from fedfaas.platform import credentials
from gateway.auth import load_or_create_secret

HERE = Path(__file__).resolve().parent
#: the uid (and gid) every FedFaaS service runs as: the ``user`` of docker-compose.yaml
UID = 12000
NODES = ("node0", "node1")
#: Redis's data folder inside its container (docker-compose.yaml's mount of fedfaas/redis)
REDIS_DATA = "/data"
ADMIN_SECRET = "gateway-admin-secret"
#: the OpenFaaS secret every function requires, as the aggregator replicas find it
FUNCTION_SECRET = "fedfaas-function-token"
#: the services that carry asynchronous invocations (faasd's compose file)
ASYNC_SERVICES = ("nats", "queue-worker")

#: each service's secrets folder: path inside it -> name in ``fedfaas/secrets/platform``
SERVICE_SECRETS: dict[str, dict[str, str]] = {
    "minio": {n: n for n in (credentials.MINIO_USER, credentials.MINIO_PASSWORD)},
    "minio-provision": {
        f"minio-root/{credentials.MINIO_USER}": credentials.MINIO_USER,
        f"minio-root/{credentials.MINIO_PASSWORD}": credentials.MINIO_PASSWORD,
        "minio-users/minio-gateway.json": "minio-gateway.json",
        "minio-users/minio-cache-engine.json": "minio-cache-engine.json",
    },
    "gateway": {
        n: n
        for n in (
            "redis-gateway.json",
            "minio-gateway.json",
            ADMIN_SECRET,
            credentials.SERVICE_TOKEN,
        )
    },
    "cache-engine": {
        n: n
        for n in (
            "redis-cache-engine.json",
            "minio-cache-engine.json",
            credentials.ADMIN_TOKEN,
            credentials.SERVICE_TOKEN,
            credentials.FUNCTION_TOKEN,
            credentials.BASIC_AUTH_USER,
            credentials.BASIC_AUTH_PASSWORD,
        )
    },
    "request-tracker": {
        n: n
        for n in (
            "redis-request-tracker.json",
            credentials.ADMIN_TOKEN,
            credentials.ANALYST_TOKEN,
            credentials.SERVICE_TOKEN,
            credentials.FUNCTION_TOKEN,
        )
    },
    "control-plane": {
        n: n for n in ("redis-control-plane.json", ADMIN_SECRET, credentials.ANALYST_TOKEN)
    },
    "function": {FUNCTION_SECRET: credentials.FUNCTION_TOKEN},
}


def platform_secrets(workdir: Path) -> Path:
    """The folder holding every secret of the platform (the job owner's and analysts' too)."""
    return workdir / "fedfaas" / "secrets" / "platform"


def _owned_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, UID, UID)
    return path


def _write(path: Path, data: bytes, mode: int, owner: int) -> None:
    """``data`` into ``path`` (replaced, never written through an existing file's mode)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chown(tmp, owner, owner)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _basic_auth(workdir: Path, master: Path) -> None:
    """faasd's basic-auth files are the platform's: faasd keeps existing ones on ``faasd up``;
    where faasd made them first, the platform takes faasd's."""
    faasd = workdir / "secrets"
    faasd.mkdir(parents=True, exist_ok=True)
    for name in (credentials.BASIC_AUTH_USER, credentials.BASIC_AUTH_PASSWORD):
        if (faasd / name).exists():
            _write(master / name, (faasd / name).read_bytes(), 0o600, 0)
        else:
            # readable by the OpenFaaS gateway's own user, as faasd writes them
            _write(faasd / name, (master / name).read_bytes(), 0o644, 0)


def write_secrets(workdir: Path) -> Path:
    """Make the platform's secrets (once) and give each service its folder; the platform's
    folder is returned."""
    master = platform_secrets(workdir)
    credentials.ensure(master)
    _basic_auth(workdir, master)
    MinioServer(data_dir=_owned_dir(workdir / "fedfaas" / "minio"), secrets_dir=master).prepare()
    redis_dir = _owned_dir(workdir / "fedfaas" / "redis")
    redis = RedisServer(data_dir=redis_dir, host="0.0.0.0", port=6379, secrets_dir=master)
    redis.prepare()
    # the configuration names its data folder as the container sees it (the bind mount's target)
    conf = redis.config_path.read_text().splitlines()
    conf = [f'dir "{REDIS_DATA}"' if line.startswith("dir ") else line for line in conf]
    _write(redis.config_path, ("\n".join(conf) + "\n").encode(), 0o600, UID)
    load_or_create_secret(master / ADMIN_SECRET)
    for service, files in SERVICE_SECRETS.items():
        folder = workdir / "fedfaas" / "secrets" / service
        shutil.rmtree(folder, ignore_errors=True)  # nothing stale stays readable
        folders = {folder} | {(folder / inside).parent for inside in files}
        for d in sorted(folders):
            _owned_dir(d)
        for inside, name in files.items():
            _write(folder / inside, (master / name).read_bytes(), 0o400, UID)
        for d in folders:
            os.chmod(d, 0o500)
    for node in NODES:
        for part in ("state", "sockets"):
            _owned_dir(workdir / "fedfaas" / node / part)
    return master


def compose(with_async: bool) -> str:
    """The compose file to install: this folder's, without the asynchronous services unless
    ``with_async``."""
    text = (HERE / "docker-compose.yaml").read_text()
    if with_async:
        return text
    doc = yaml.safe_load(text)
    for name in ASYNC_SERVICES:
        doc["services"].pop(name)
    gw = doc["services"]["gateway"]
    gw["environment"] = [e for e in gw["environment"] if not e.startswith("faas_nats_")]
    gw["depends_on"] = [d for d in gw["depends_on"] if d not in ASYNC_SERVICES]
    head = "# installed by deploy/faasd/prepare.py --no-async: no NATS Streaming, no queue worker\n"
    return head + yaml.safe_dump(doc, sort_keys=False)


def install(workdir: Path, with_async: bool = True) -> Path:
    """Install the compose file and its companions, and write the secrets; returns the
    platform's secrets folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "docker-compose.yaml").write_text(compose(with_async))
    for name in ("prometheus.yml", "wait-for.py"):
        shutil.copyfile(HERE / name, workdir / name)
        os.chmod(workdir / name, 0o644)
    return write_secrets(workdir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python deploy/faasd/prepare.py",
        description="Install FedFaaS's compose services and their secrets into a faasd "
        "working folder.",
    )
    p.add_argument("workdir", type=Path, help="faasd's working folder (/var/lib/faasd)")
    p.add_argument(
        "--no-async",
        action="store_true",
        help="leave NATS Streaming and the queue worker out (no asynchronous invocations)",
    )
    ns = p.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "prepare.py: run as root (it hands the services' files to uid 12000)", file=sys.stderr
        )
        return 1
    master = install(ns.workdir.resolve(), with_async=not ns.no_async)
    print(f"FedFaaS installed in {ns.workdir}; the platform's secrets are in {master}.")
    print("Next: faasd up (in that folder), then")
    print(f"  faas-cli secret create {FUNCTION_SECRET} --from-file {master / 'function-token'}")
    print("  faas-cli deploy -f stack.yml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
