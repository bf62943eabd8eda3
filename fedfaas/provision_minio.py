"""``python -m fedfaas.provision_minio``: create the checkpoint bucket and the components' MinIO
users, as ``fedfaas up`` does (:func:`core.services.provision_minio`), from secret files.

The Helm chart runs it in its post-install/post-upgrade hook Job::

    python -m fedfaas.provision_minio --endpoint fedfaas-minio.openfaas:9000 \\
        --root-credentials-dir /var/secrets/minio-root --users-dir /var/secrets/minio-users

``--root-credentials-dir`` holds MinIO's root user and password as the files ``minio-root-user``
and ``minio-root-password``; ``--users-dir`` holds one credentials file per component user,
``minio-<user>.json`` (:func:`core.services.minio_user_file`). Only paths are given: no secret
is on the command line or in the environment. It waits up to ``--wait`` seconds for MinIO to be
ready, then exits 0 once every user exists with its policy; 1, with the reason on stderr,
otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.services import (
    MINIO_ROOT_PASSWORD,
    MINIO_ROOT_USER,
    http_ok,
    minio_policies,
    minio_user_file,
    provision_minio,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fedfaas.provision_minio",
        description="Create the checkpoint bucket and each FedFaaS component's MinIO user with "
        "its policy (idempotent).",
    )
    p.add_argument("--endpoint", required=True, help="MinIO as HOST:PORT")
    p.add_argument(
        "--root-credentials-dir",
        type=Path,
        required=True,
        help=f"folder holding the files {MINIO_ROOT_USER} and {MINIO_ROOT_PASSWORD}",
    )
    p.add_argument(
        "--users-dir",
        type=Path,
        required=True,
        help="folder holding minio-<user>.json for each user: "
        + ", ".join(sorted(minio_policies(""))),
    )
    p.add_argument("--bucket", default="fedfaas", help="the checkpoint bucket (default fedfaas)")
    p.add_argument("--secure", action="store_true", help="HTTPS instead of HTTP")
    p.add_argument(
        "--wait",
        type=float,
        default=300.0,
        help="seconds to wait for MinIO to be ready (default 300)",
    )
    return p


def wait_ready(endpoint: str, secure: bool, timeout: float) -> bool:
    """True once ``/minio/health/ready`` answers 200, False after ``timeout`` seconds."""
    url = f"{'https' if secure else 'http'}://{endpoint}/minio/health/ready"
    deadline = time.monotonic() + timeout
    while not http_ok(url):
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)
    return True


def main(argv: list[str] | None = None) -> int:
    from minio.error import MinioAdminException, MinioException
    from urllib3.exceptions import HTTPError

    from core.auth import AuthConfigError, read_token_file
    from core.secretfiles import Credentials, read_credentials

    args = parser().parse_args(argv)
    try:
        root = Credentials(
            read_token_file(args.root_credentials_dir / MINIO_ROOT_USER, "MinIO root user"),
            read_token_file(args.root_credentials_dir / MINIO_ROOT_PASSWORD, "MinIO root password"),
        )
        files = {u: minio_user_file(args.users_dir, u) for u in minio_policies(args.bucket)}
        for path in files.values():  # a missing file fails here, before any wait
            read_credentials(path, "MinIO")
        if not wait_ready(args.endpoint, args.secure, args.wait):
            print(f"MinIO at {args.endpoint} not ready after {args.wait:.0f}s", file=sys.stderr)
            return 1
        provision_minio(args.endpoint, root, files, args.bucket, secure=args.secure)
    except (
        AuthConfigError,
        KeyError,
        MinioException,
        MinioAdminException,
        HTTPError,
        OSError,
    ) as exc:
        print(f"provisioning MinIO at {args.endpoint} failed: {exc}", file=sys.stderr)
        return 1
    print(f"MinIO at {args.endpoint}: bucket {args.bucket}, users {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
