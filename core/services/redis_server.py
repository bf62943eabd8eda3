"""Redis with one ACL user per component (:data:`REDIS_USERS`), ``default`` off."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis


from core.services.process import (
    Server,
    ServiceError,
    find_binary,
    free_port,
    redis_ping,
    secrets_folder,
    write_once,
)

log = logging.getLogger(__name__)


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
class RedisServer(Server):
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
        secrets_folder(self.credentials_file("admin").parent)
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
            write_once(path, json.dumps(doc))
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
