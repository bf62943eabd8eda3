"""Real backing services (Redis, MinIO, Prometheus) as child processes on loopback.

Used by ``fedfaas up`` and by the test fixtures alike, so that what the tests exercise is
exactly what the platform runs. Each server takes a free loopback port unless one is given,
keeps its data under a folder of its own, and is stopped by PID (process group) on ``stop``.

Neither lets anyone in without a user: Redis has one ACL user per component and MinIO one user
per component with a policy on the checkpoint bucket, each with a random password in a
credentials file of its own (``credentials_file(user)``), which is what a component is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from minio import Minio

    from core.secretfiles import Credentials

log = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))


class ServiceError(RuntimeError):
    """A backing service could not be found, started or reached."""


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now, below the kernel's ephemeral range.

    A port the kernel handed out itself (``bind(0)``) lies in the range it also draws the source
    ports of outgoing connections from: between the choice and the server's own bind, any
    connection on the machine can take it, and the server fails with EADDRINUSE (seen in CI:
    ``fedfaas up``'s gateway lost its port to a connection made while functions deployed). A
    port below that range is taken only by someone binding it on purpose.
    """
    low = _ephemeral_low()
    first = max(1024, low - 12288)
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(first, low) if low > first else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all tried were busy
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(
    host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until ``host:port`` accepts TCP connections, or raise ``ServiceError``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceError(
                f"process exited with code {proc.returncode} before listening on {port}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServiceError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


def http_ok(url: str, timeout: float = 1.0, headers: dict[str, str] | None = None) -> bool:
    """True when a GET of ``url`` answers 200 right now (no retries)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def redis_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis server on ``host:port`` answers an unauthenticated ``PING`` right now:
    with ``+PONG``, or (a server that needs a user, as FedFaaS's do) with ``-NOAUTH``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def find_binary(name: str) -> str | None:
    """Find ``name`` on PATH or in the FedFaaS cache (where setup builds MinIO)."""
    found = shutil.which(name)
    if found:
        return found
    for cand in (
        CACHE_DIR / "bin" / name,
        CACHE_DIR / "gobin" / name,
        Path("/usr/sbin") / name,
        Path("/usr/bin") / name,
    ):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def spawn(
    argv: list[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session (and process group) of its own, output appended to a log file.

    The one way FedFaaS starts a child process: the backing servers, the runtime, each function
    replica and the platform's daemons. Their own session means a signal to the parent's group
    (Ctrl-C in a terminal) does not reach them, and :func:`stop_group` stops the child together
    with whatever it started. The log file is closed in this process once the child holds it.

    Parameters
    ----------
    argv:
        Command line.
    log_path:
        stdout and stderr are appended here (its folder is created).
    env:
        The child's whole environment (default: this process's), plus
        ``PYTHONFAULTHANDLER=1`` unless it sets that: a Python child that dies of a signal
        (a C extension's segfault) leaves its threads' tracebacks in its log.
    cwd:
        Working folder (default: this process's).
    pass_fds:
        File descriptors the child inherits (all others are closed).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PYTHONFAULTHANDLER": "1", **(os.environ if env is None else env)},
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM the process group led by ``proc``, SIGKILL it after ``timeout`` s; reap ``proc``.

    Returns the exit code, or ``None`` if the process survived SIGKILL for 5 seconds.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not stop in %.0fs; SIGKILL", proc.pid, timeout)
    # the leader may be gone while members of its group (its children) are not
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        log.error("pid %d survived SIGKILL", proc.pid)
        return None


@dataclass
class ChildProcess:
    """A child process in its own process group, with its log in a file; see :func:`spawn`."""

    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, kw_only=True)

    def _spawn(
        self,
        argv: list[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        self.proc = spawn(argv, log_path=log_path, env={**os.environ, **(env or {})}, cwd=cwd)
        return self.proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc is not None:
            stop_group(self.proc, timeout)
        self.proc = None


@dataclass
class _Server(ChildProcess):
    """A backing server on ``host:port`` keeping its data (and ``server.log``) in ``data_dir``."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def _start(
        self, argv: list[str], ready: Callable[[], None], env: dict[str, str] | None = None
    ) -> None:
        """Spawn ``argv``, then ``ready()`` (it raises unless the server serves); a start that
        fails there (its port taken, not ready in time, a bad configuration, Ctrl-C) stops the
        server before the error goes up, so it leaves no process behind (one did in CI)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(argv, self.log_path, env)
        try:
            ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, name: str, probe: Callable[[], bool], timeout: float) -> None:
        """Poll ``probe`` until it holds; :class:`ServiceError` when the server exits first
        (with the end of its log, which says why) or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while not probe():
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(
                    f"{name} exited with code {self.proc.returncode}: "
                    f"{self._log_tail()} (see {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"{name} on {self.host}:{self.port} not ready after {timeout:g}s"
                )
            time.sleep(0.1)

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log"
        return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())


def _write_once(path: Path, value: str) -> None:
    """Create ``path`` (mode 0600) holding ``value`` unless it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(value)


def _secrets_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


#: Redis ACL users (besides ``default``, which is off): name -> key patterns and commands.
#: Each component reaches only its own keys and no dangerous or admin command (``CONFIG``,
#: ``FLUSHALL``, ``ACL``, ``KEYS``, ...), and no Pub/Sub channel but the cache engine's change
#: messages, which the request tracker follows; ``admin`` is the launcher's and the tests'.
REDIS_USERS: dict[str, str] = {
    "admin": "~* &* +@all",
    "gateway": "~fedfaas:* resetchannels +@all -@dangerous -@admin",
    "control-plane": "~fedfaas:control:* resetchannels +@all -@dangerous -@admin",
    "cache-engine": "~flstore:* resetchannels &flstore:changes +@all -@dangerous -@admin",
    "request-tracker": "~flstore:* resetchannels &flstore:changes +@all -@dangerous -@admin",
    "baseline": "~baseline:* resetchannels +@all -@dangerous -@admin",
    # the embedded runtime's queue of asynchronous calls (they hold callers' function tokens,
    # so the prefix is outside the gateway's fedfaas:*)
    "runtime": "~runtime:async:* resetchannels +@all -@dangerous -@admin",
}


@dataclass
class RedisServer(_Server):
    """Debian's ``redis-server`` on a loopback port, persistence in ``data_dir``.

    Nobody gets in without a user: the ``default`` user is off and each of :data:`REDIS_USERS`
    has a random password, kept as a credentials file (:mod:`core.secretfiles`) in
    ``secrets_dir`` (default ``data_dir/secrets``): :meth:`credentials_file` names the file a
    component is given. The server's configuration (``redis.conf``, mode 0600) holds only the
    passwords' SHA-256, never a password, and nothing secret is on its command line.
    """

    secrets_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "redis.conf"

    def credentials_file(self, user: str) -> Path:
        """The credentials file of ACL user ``user`` (one of :data:`REDIS_USERS`)."""
        if user not in REDIS_USERS:
            raise KeyError(f"no Redis user {user!r}; the users are {sorted(REDIS_USERS)}")
        return (self.secrets_dir or self.data_dir / "secrets") / f"redis-{user}.json"

    def prepare(self) -> None:
        """Create the users' credentials files that do not exist yet and write ``redis.conf``."""
        import hashlib
        import json
        import secrets

        from core.secretfiles import read_credentials

        self.data_dir.mkdir(parents=True, exist_ok=True)
        _secrets_folder(self.credentials_file("admin").parent)
        lines = [
            f"bind {self.host}",
            f"port {self.port}",
            f'dir "{self.data_dir}"',
            'save ""',
            "appendonly yes",
            "appendfsync everysec",
            "protected-mode yes",
            "daemonize no",
            "user default off",
        ]
        for user, rules in REDIS_USERS.items():
            path = self.credentials_file(user)
            doc = {"username": user, "password": secrets.token_urlsafe(24)}
            _write_once(path, json.dumps(doc))
            digest = hashlib.sha256(read_credentials(path, "Redis").password.encode()).hexdigest()
            lines.append(f"user {user} on #{digest} {rules}")
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(self.config_path, 0o600)

    def command(self) -> list[str]:
        """The ``redis-server`` command line: the configuration file written by :meth:`prepare`."""
        binary = find_binary("redis-server")
        if binary is None:
            raise ServiceError(
                "redis-server not found: run `make setup` (apt-get install redis-server)"
            )
        return [binary, str(self.config_path)]

    def client(self, user: str = "admin", **kw: Any) -> redis.Redis:
        """A ``redis.Redis`` logged in as ``user`` (default the admin)."""
        from core.secretfiles import redis_client

        return redis_client(self.url, self.credentials_file(user), **kw)

    def ping(self, timeout: float = 1.0) -> bool:
        """True when the server answers a ``PING`` right now (see :func:`redis_ping`)."""
        return redis_ping(self.host, self.port, timeout)

    def serving(self, timeout: float = 1.0) -> bool:
        """True when *this* server answers: a ``PING`` answered, then the admin's ``INFO``
        naming this process. A Redis already on the port answers ``PING`` too while ours
        exits with "Address already in use"."""
        if not self.ping(timeout):
            return False
        import redis

        try:
            with self.client(socket_timeout=timeout) as r:
                pid = int(r.info("server")["process_id"])
        except (redis.RedisError, OSError, KeyError, ValueError):
            return False  # not ours (our users unknown there) or not up yet
        return pid == self.pid

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.port = self.port or free_port(self.host)
        self.prepare()
        # our process answering, not a port that accepts or a PING: another listener on the
        # port accepts, another Redis there answers PING
        self._start(self.command(), lambda: self._wait_ready("redis-server", self.serving, timeout))
        log.info("redis on %s:%d (pid %s)", self.host, self.port, self.pid)
        return self


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

    from core.secretfiles import read_credentials

    policies = minio_policies(bucket)
    missing = sorted(set(policies) - set(credentials_files))
    if missing:
        raise KeyError(f"no credentials file for the MinIO users {missing}")
    users = {u: read_credentials(credentials_files[u], "MinIO") for u in policies}
    mc = Minio(endpoint, access_key=root.username, secret_key=root.password, secure=secure)
    if not mc.bucket_exists(bucket):
        mc.make_bucket(bucket)
    admin = MinioAdmin(
        endpoint=endpoint,
        credentials=StaticProvider(root.username, root.password),
        secure=secure,
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
class MinioServer(_Server):
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

        _secrets_folder(self._secrets())
        _write_once(self._secrets() / MINIO_ROOT_USER, "fedfaas-root")
        _write_once(self._secrets() / MINIO_ROOT_PASSWORD, secrets.token_urlsafe(24))
        for user in minio_policies(self.bucket):
            doc = {"username": f"fedfaas-{user}", "password": secrets.token_urlsafe(24)}
            _write_once(self.credentials_file(user), json.dumps(doc))

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
        """A MinIO client logged in as root."""
        from minio import Minio

        return Minio(
            self.endpoint, access_key=self.access_key, secret_key=self.secret_key, secure=False
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
        self.port = self.port or free_port(self.host)
        self.console_port = self.console_port or free_port(self.host)
        self.prepare()

        def ready() -> None:
            self._wait_ready("minio", self.ready, timeout)
            self.provision()

        self._start(self.command(), ready, env=self.environment())
        log.info("minio on %s (console %s, pid %s)", self.url, self.console_url, self.pid)
        return self


@dataclass
class PrometheusServer(_Server):
    """Debian's ``prometheus`` on a loopback port, scraping ``targets`` (``host:port`` each,
    path ``/metrics``) every ``scrape_interval``; its TSDB in ``data_dir/tsdb``.

    OpenFaaS's gateway needs one: it reads its functions' invocation counts from Prometheus'
    query API (``faas_prometheus_host``/``faas_prometheus_port``) and has no way to send a
    credential there, so this server has no login. It therefore listens on loopback only and
    holds nothing but the metrics of what it scrapes. Its configuration is ``prometheus.yml``
    in ``data_dir``, written by :meth:`prepare`.
    """

    targets: list[str] = field(default_factory=list)
    scrape_interval: str = "1s"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "prometheus.yml"

    def prepare(self) -> None:
        """Write ``prometheus.yml``: one job, ``fedfaas``, over :attr:`targets`."""
        import json

        self.data_dir.mkdir(parents=True, exist_ok=True)
        # YAML is a superset of JSON: the list of targets is written as JSON, quoted
        lines = [
            "global:",
            f"  scrape_interval: {self.scrape_interval}",
            f"  evaluation_interval: {self.scrape_interval}",
            "scrape_configs:",
            "  - job_name: fedfaas",
            "    static_configs:",
            f"      - targets: {json.dumps(list(self.targets))}",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        """The ``prometheus`` command line: the configuration of :meth:`prepare`, the TSDB in
        ``data_dir/tsdb``, the web API on ``host:port``."""
        binary = find_binary("prometheus")
        if binary is None:
            raise ServiceError(
                "prometheus not found: run `make setup` (apt-get install prometheus)"
            )
        return [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--log.level=warn",
        ]

    def ready(self, timeout: float = 1.0) -> bool:
        """True when ``/-/ready`` answers 200 right now."""
        return http_ok(f"{self.url}/-/ready", timeout)

    def query(self, promql: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The result vector of the instant query ``promql`` (``/api/v1/query``)."""
        import json
        import urllib.parse
        import urllib.request

        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.load(r)
        if doc.get("status") != "success":
            raise ServiceError(f"prometheus query {promql!r} failed: {doc}")
        return list(doc["data"]["result"])

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.port = self.port or free_port(self.host)
        self.prepare()
        self._start(self.command(), lambda: self._wait_ready("prometheus", self.ready, timeout))
        log.info("prometheus on %s scraping %s (pid %s)", self.url, self.targets, self.pid)
        return self
