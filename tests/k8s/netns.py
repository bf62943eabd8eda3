"""A private pid+mount+net namespace for a test's cluster: nothing it runs touches the host's
network, and everything it runs dies with it.

``unshare --mount --net --pid --fork --mount-proc`` starts the namespace's init (a Python loop
that only reaps); loopback comes up with one more address, :data:`NODE_IP`, which stands for
the node's IP (Kubernetes refuses loopback addresses in Endpoints, so the API server cannot
advertise 127.0.0.1). Programs start inside with ``nsenter`` (:meth:`PrivateNamespace.spawn`,
or :meth:`PrivateNamespace.wrapper` for a client program such as helm or faas-cli); this
process reaches the namespace's network from a thread of its own that entered it
(:meth:`PrivateNamespace.call`: a network namespace is per thread, and a socket stays in the
namespace it was made in). Files are the host's: the mount namespace only keeps
mounts made inside (``/proc`` of the new pid namespace) from leaking out.

:meth:`PrivateNamespace.stop` kills the init; the kernel then kills every process of the pid
namespace, those started with ``nsenter`` included.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from core.services import spawn, stop_group

T = TypeVar("T")

#: the namespace's "node" address (on its loopback interface)
NODE_IP = "10.250.0.1"
_CLONE_NEWNET = 0x40000000
# SIGCHLD ignored: the kernel reaps the orphans re-parented to this init at once
_INIT = (
    "import signal, sys\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "while True:\n"
    "    signal.pause()\n"
)


class NamespaceError(RuntimeError):
    """The namespace could not be made (no privilege, no ``unshare``)."""


def _enter_netns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class PrivateNamespace:
    """A pid+mount+net namespace whose files (logs, wrappers) live in ``folder``.

    Parameters
    ----------
    folder
        The namespace's folder on the host (created): ``init.log``, the wrappers' ``bin/``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._unshare: subprocess.Popen[bytes] | None = None
        self._children: list[subprocess.Popen[bytes]] = []
        self._pool: ThreadPoolExecutor | None = None
        #: the host pid of the namespace's init
        self.pid = 0

    @property
    def netns(self) -> str:
        """The path of the namespace's network namespace (for ``nsenter --net=``)."""
        return f"/proc/{self.pid}/ns/net"

    def start(self, timeout: float = 20.0) -> PrivateNamespace:
        """Make the namespace; returns once its loopback is up."""
        self.folder.mkdir(parents=True, exist_ok=True)
        setup = (
            f"ip link set lo up && ip addr add {NODE_IP}/32 dev lo && "
            f"exec {shlex.quote(sys.executable)} -c {shlex.quote(_INIT)}"
        )
        self._unshare = spawn(
            [
                "unshare",
                "--mount",
                "--net",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "--",
                "/bin/sh",
                "-c",
                setup,
            ],
            log_path=self.folder / "init.log",
        )
        deadline = time.monotonic() + timeout
        while not self._init_ready():
            if self._unshare.poll() is not None:
                raise NamespaceError(
                    f"unshare exited with code {self._unshare.returncode}: "
                    f"{(self.folder / 'init.log').read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise NamespaceError(f"the namespace's init did not start in {timeout:.0f}s")
            time.sleep(0.05)
        self._pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="netns",
            initializer=_enter_netns,
            initargs=(self.netns,),
        )
        return self

    def _init_ready(self) -> bool:
        """True once unshare's child has exec'd the init (so the addresses are up)."""
        assert self._unshare is not None
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
        try:
            pids = children.read_text().split()
            if not pids:
                return False
            cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes()
        except OSError:
            return False
        if b"signal.pause" not in cmdline:
            return False
        self.pid = int(pids[0])
        return True

    def _enter(self, cwd: Path | None) -> list[str]:
        # entering a mount namespace moves the working folder to its root: name it again
        wd = str(cwd or Path.cwd())
        return ["nsenter", f"--target={self.pid}", "--net", "--mount", "--pid", f"--wd={wd}", "--"]

    def spawn(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside (:func:`core.services.spawn`: own process group, output
        appended to ``log_path``); it dies with the namespace at the latest."""
        proc = spawn([*self._enter(cwd), *argv], log_path=log_path, env=env, cwd=cwd)
        self._children.append(proc)
        return proc

    def wrapper(self, name: str, binary: Path | str) -> Path:
        """An executable ``bin/<name>`` that runs ``binary`` (its arguments, environment and
        working folder passed on) inside the namespace: for code that runs a program by
        path, such as :class:`tests.openfaas.conftest.FaasCli`."""
        path = self.folder / "bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "#!/bin/sh\n"
            f'exec nsenter --target={self.pid} --net --mount --pid --wd="$(pwd)" -- '
            f'{shlex.quote(str(binary))} "$@"\n'
        )
        path.chmod(0o755)
        return path

    def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``fn(*args, **kwargs)`` on this process's thread inside the namespace's network:
        the sockets it opens (an HTTP client's connections) are the namespace's."""
        if self._pool is None:
            raise NamespaceError("the namespace is not started")
        return self._pool.submit(fn, *args, **kwargs).result()

    def stop(self, timeout: float = 20.0) -> None:
        """Kill the init (so every process inside), then reap what was started here."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._unshare is not None:
            # unshare --kill-child: the init gets SIGKILL when unshare dies
            stop_group(self._unshare, timeout)
            self._unshare = None
        for proc in self._children:
            stop_group(proc, timeout)
        self._children.clear()

    def alive(self) -> bool:
        """True while the init lives (a killed init not yet reaped is dead)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text() if self.pid > 0 else ""
        except OSError:
            return False
        # the state follows the command's name in parentheses: Z(ombie) or X (dead)
        return bool(stat) and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
