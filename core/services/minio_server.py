"""MinIO with one user per component, each with a policy on the checkpoint bucket."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minio import Minio

    from core.secretfiles import Credentials


from core.services.process import (
    Server,
    ServiceError,
    find_binary,
    free_port,
    free_ports,
    http_ok,
    secrets_folder,
    write_once,
)

log = logging.getLogger(__name__)


#: MinIO's root credentials, plain files that MinIO itself reads (``MINIO_ROOT_USER_FILE``,
#: ``MINIO_ROOT_PASSWORD_FILE``); they stay with the launcher.
MINIO_ROOT_USER = "minio-root-user"
MINIO_ROOT_PASSWORD = "minio-root-password"


def _bucket_policy(
    bucket: str, bucket_actions: list[str], object_actions: list[str]
) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": bucket_actions,
                "Resource": [f"arn:aws:s3:::{bucket}"],
            },
            {
                "Effect": "Allow",
                "Action": object_actions,
                "Resource": [f"arn:aws:s3:::{bucket}/*"],
            },
        ],
    }


def minio_policies(bucket: str) -> dict[str, dict[str, Any]]:
    """The MinIO users a platform has, each with its policy on ``bucket`` only.

    ``gateway``: reads, writes, lists and deletes the checkpoints (every job's; it resumes
    from them). ``cache-engine``: reads them, and mints per-job temporary credentials for the
    cache functions (MinIO's ``AssumeRole``; a session policy narrows them to one job).
    """
    return {
        "gateway": _bucket_policy(
            bucket,
            ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
            [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
        ),
        "cache-engine": _bucket_policy(
            bucket, ["s3:GetBucketLocation", "s3:ListBucket"], ["s3:GetObject"]
        ),
    }


def minio_user_file(folder: Path, user: str) -> Path:
    """The credentials file of MinIO component user ``user`` in ``folder``:
    ``minio-<user>.json`` (the same name on ``fedfaas up`` and in the Helm chart's secret)."""
    if user not in minio_policies(""):
        raise KeyError(f"no MinIO user {user!r}; the users are {sorted(minio_policies(''))}")
    return folder / f"minio-{user}.json"


def provision_minio(
    endpoint: str,
    root: Credentials,
    credentials_files: Mapping[str, Path],
    bucket: str,
    *,
    secure: bool = False,
) -> None:
    """Create ``bucket`` and each component's user with its policy (idempotent).

    For each user of :func:`minio_policies`, the policy ``fedfaas-<user>`` is written (replaced
    if it exists), the user in its credentials file is created (or its password reset) and the
    policy attached to it. ``fedfaas up`` runs it through :meth:`MinioServer.provision`, the Helm
    chart's hook Job through ``python -m fedfaas.provision_minio``.

    Parameters
    ----------
    endpoint:
        ``host:port`` of MinIO.
    root:
        MinIO's root user, the only one that may manage users.
    credentials_files:
        Component user -> its credentials file (:mod:`core.secretfiles`); every user of
        :func:`minio_policies` must be there.
    bucket:
        The checkpoint bucket, the only one the policies allow.
    secure:
        HTTPS instead of HTTP.

    Raises
    ------
    KeyError
        A user of :func:`minio_policies` has no credentials file in ``credentials_files``.
    core.auth.AuthConfigError
        A credentials file is missing or malformed.
    """
    from minio import Minio
    from minio.credentials.providers import StaticProvider
    from minio.error import MinioAdminException
    from minio.minioadmin import MinioAdmin

    from core.checkpoints import retrying_http
    from core.secretfiles import read_credentials

    policies = minio_policies(bucket)
    missing = sorted(set(policies) - set(credentials_files))
    if missing:
        raise KeyError(f"no credentials file for the MinIO users {missing}")
    users = {u: read_credentials(credentials_files[u], "MinIO") for u in policies}
    # right after a start MinIO may answer 503 with Retry-After: 60 for a moment; the retrying
    # client asks again within seconds instead of sleeping a minute
    mc = Minio(
        endpoint,
        access_key=root.username,
        secret_key=root.password,
        secure=secure,
        http_client=retrying_http(),
    )
    if not mc.bucket_exists(bucket):
        mc.make_bucket(bucket)
    admin = MinioAdmin(
        endpoint=endpoint,
        credentials=StaticProvider(root.username, root.password),
        secure=secure,
        http_client=retrying_http(),
    )
    for user, policy in policies.items():
        c = users[user]
        # MinIO loads its IAM state in the background after it starts answering: a policy
        # added meanwhile can be gone when it is attached (404 XMinioAdminNoSuchPolicy, seen
        # once under CI). Each step is idempotent, so the three are done again until it holds.
        deadline = time.monotonic() + 60
        while True:
            admin.policy_add(f"fedfaas-{user}", policy=policy)
            admin.user_add(c.username, c.password)
            try:
                admin.policy_set(f"fedfaas-{user}", user=c.username)
                break
            except MinioAdminException as exc:
                if "NoSuchPolicy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@dataclass
class MinioServer(Server):
    """The real MinIO server on a loopback port, with its console on another.

    Its root credentials are random files in ``secrets_dir`` (default ``data_dir/secrets``)
    that MinIO reads itself (their paths are in its environment, the values never are).
    :meth:`provision`, run by :meth:`start`, creates ``bucket`` and one user per component
    (:func:`minio_policies`), each with a random password in its own credentials file
    (:meth:`credentials_file`).
    """

    console_port: int = 0
    secrets_dir: Path | None = None
    bucket: str = "fedfaas"

    @property
    def endpoint(self) -> str:
        """``host:port`` as the MinIO client wants it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def console_url(self) -> str:
        return f"http://{self.host}:{self.console_port}"

    def _secrets(self) -> Path:
        return self.secrets_dir or self.data_dir / "secrets"

    @property
    def access_key(self) -> str:
        """The root user (the launcher's and the tests' only)."""
        return (self._secrets() / MINIO_ROOT_USER).read_text().strip()

    @property
    def secret_key(self) -> str:
        """The root password (the launcher's and the tests' only)."""
        return (self._secrets() / MINIO_ROOT_PASSWORD).read_text().strip()

    def credentials_file(self, user: str) -> Path:
        """The credentials file of component user ``user`` (see :func:`minio_policies`)."""
        return minio_user_file(self._secrets(), user)

    def prepare(self) -> None:
        """Create the root and the users' credentials files that do not exist yet."""
        import json
        import secrets

        secrets_folder(self._secrets())
        write_once(self._secrets() / MINIO_ROOT_USER, "fedfaas-root")
        write_once(self._secrets() / MINIO_ROOT_PASSWORD, secrets.token_urlsafe(24))
        for user in minio_policies(self.bucket):
            doc = {"username": f"fedfaas-{user}", "password": secrets.token_urlsafe(24)}
            write_once(self.credentials_file(user), json.dumps(doc))

    def command(self) -> list[str]:
        """The ``minio server`` command line (API and console both on ``host``)."""
        binary = find_binary("minio")
        if binary is None:
            raise ServiceError(
                "minio not found on PATH or in ~/.cache/fedfaas/bin: run `make setup` "
                "(go install github.com/minio/minio@latest)"
            )
        return [
            binary,
            "server",
            str(self.data_dir / "data"),
            "--address",
            f"{self.host}:{self.port}",
            "--console-address",
            f"{self.host}:{self.console_port}",
            "--quiet",
        ]

    def environment(self) -> dict[str, str]:
        """Environment for the server: the PATHS of its root credentials, console on, no update
        checks."""
        return {
            "MINIO_ROOT_USER_FILE": str(self._secrets() / MINIO_ROOT_USER),
            "MINIO_ROOT_PASSWORD_FILE": str(self._secrets() / MINIO_ROOT_PASSWORD),
            "MINIO_BROWSER": "on",
            "MINIO_UPDATE": "off",
        }

    def client(self) -> Minio:
        """A MinIO client logged in as root (never a minute asleep on MinIO's Retry-After:
        :func:`core.checkpoints.retrying_http`)."""
        from minio import Minio

        from core.checkpoints import retrying_http

        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            http_client=retrying_http(),
        )

    def provision(self) -> None:
        """Create the bucket, and each component's user with its policy (idempotent); see
        :func:`provision_minio`."""
        from core.secretfiles import Credentials

        provision_minio(
            self.endpoint,
            Credentials(self.access_key, self.secret_key),
            {user: self.credentials_file(user) for user in minio_policies(self.bucket)},
            self.bucket,
        )

    def ready(self, timeout: float = 1.0) -> bool:
        """True when ``/minio/health/ready`` answers 200 right now."""
        return http_ok(f"{self.url}/minio/health/ready", timeout)

    def start(self, timeout: float = 60.0) -> MinioServer:
        if not self.port and not self.console_port:  # two free_port() draws can be one port
            self.port, self.console_port = free_ports(2, self.host)
        self.port = self.port or free_port(self.host)
        self.console_port = self.console_port or free_port(self.host)
        self.prepare()

        def ready() -> None:
            self._wait_ready("minio", self.ready, timeout)
            self.provision()

        self._start(self.command(), ready, env=self.environment())
        log.info("minio on %s (console %s, pid %s)", self.url, self.console_url, self.pid)
        return self
