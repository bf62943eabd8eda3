"""A running faasd with FedFaaS's compose services, in a namespace of the test's own.

:class:`Faasd` (made by :func:`tests.containers.faasd_start.start`) runs programs inside that
namespace (:meth:`Faasd.run`: ``nsenter`` into its network and mounts, where the services' names
resolve), deploys functions with the real ``faas-cli`` (:meth:`Faasd.deploy`: images checked
first, health checked after) and stops everything (:meth:`Faasd.stop`): the namespace's PID 1
ends, the kernel ends the rest, and the cgroup folders faasd's containers leave are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.containers.conftest import http_in_netns, image_exists, stack_images

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))
GATEWAY = "http://127.0.0.1:8080"
#: containerd's root, kept from run to run (:mod:`tests.containers.faasd_root` makes it whole
#: before scripts/faasd-up.sh runs faasd on it)
CONTAINERD_ROOT = CACHE / "faasd" / "containerd"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAMESPACES = ("openfaas", "openfaas-fn")


class FaasdError(RuntimeError):
    """faasd or a FedFaaS service did not start, or a deployment failed: the message says
    which and why."""


def openfaas_bin() -> Path:
    """The folder of OpenFaaS's own programs: ``$FEDFAAS_OPENFAAS_BIN``, else
    ``../shared/openfaas/bin`` beside the repository."""
    return Path(
        os.environ.get("FEDFAAS_OPENFAAS_BIN") or REPO.parent / "shared" / "openfaas" / "bin"
    )


@dataclass
class Faasd:
    """A running faasd in its own namespace (see :func:`tests.containers.faasd_start.start`)."""

    run_dir: Path
    proc: subprocess.Popen[bytes]
    #: the namespace's PID 1, as this process sees it
    pid: int
    with_async: bool
    lock: IO[bytes] | None = field(default=None, repr=False)
    #: ``(containerd namespace, image)`` imported into the kept root before faasd started
    root_imported: list[tuple[str, str]] = field(default_factory=list)
    #: why the kept root was made again before faasd started (None: it was not)
    root_rebuilt: str | None = None
    cli_home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.cli_home = self.run_dir / "faas-cli-home"
        self.cli_home.mkdir(exist_ok=True)

    # -- where things are --------------------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        """faasd's /var/lib/faasd, as this process sees it (the overlay's upper folder)."""
        return self.run_dir / "ovl" / "var-lib" / "upper" / "faasd"

    @property
    def secrets(self) -> Path:
        """Every secret of the platform (deploy/faasd/prepare.py)."""
        return self.workdir / "fedfaas" / "secrets" / "platform"

    def secret(self, name: str) -> str:
        return (self.secrets / name).read_text().strip()

    def basic_auth(self) -> tuple[str, str]:
        """faasd's gateway login (``/system/*``)."""
        s = self.workdir / "secrets"
        return (s / "basic-auth-user").read_text().strip(), (
            s / "basic-auth-password"
        ).read_text().strip()

    def _log_path(self, namespace: str, name: str) -> Path:
        """Where scripts/faasd-up.sh's log driver writes a container's output."""
        return self.run_dir / "logs" / "containers" / namespace / f"{name}.log"

    def container_log(self, namespace: str, name: str, lines: int = 30) -> str:
        """The last ``lines`` of a container's output (scripts/faasd-up.sh's log driver)."""
        path = self._log_path(namespace, name)
        if not path.exists():
            return f"(no output of {namespace}/{name})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def settled_log(self, namespace: str, name: str, lines: int = 30, timeout: float = 10.0) -> str:
        """:meth:`container_log` once the output has stopped growing for a second (at most
        ``timeout`` seconds): a stopped container's last lines may reach its log after its task
        reads STOPPED (the log driver copies them), and of-watchdog relays its function's output
        on a goroutine of its own, so the reason a function gave may come after the watchdog's
        "Forked function has terminated"."""
        path = self._log_path(namespace, name)

        def size() -> int:
            return path.stat().st_size if path.exists() else -1

        deadline = time.monotonic() + timeout
        before = size()
        while time.monotonic() < deadline:
            time.sleep(1)
            now = size()
            if now == before:
                break
            before = now
        return self.container_log(namespace, name, lines)

    # -- running things inside ---------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | bytes | None = None,
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the namespace's network and mounts (its /etc/hosts names the
        services), from the repository's folder; output as text, never raises on a status."""
        cmd = ["nsenter", f"--target={self.pid}", "--net", "--mount", f"--wd={REPO}", *argv]
        data = input.encode() if isinstance(input, str) else input
        res = subprocess.run(
            cmd, input=data, capture_output=True, timeout=timeout, env=dict(env or os.environ)
        )
        return subprocess.CompletedProcess(
            res.args,
            res.returncode,
            res.stdout.decode(errors="replace"),
            res.stderr.decode(errors="replace"),
        )

    def hosts(self) -> dict[str, str]:
        """Compose service name -> its address on faasd's bridge (the hosts file faasd writes)."""
        out = {}
        for line in (self.workdir / "hosts").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[1]] = parts[0]
        return out

    def http(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
    ) -> tuple[int, str]:
        """``(status, body)`` of one HTTP request from inside the namespace, a compose
        service's name in ``url`` resolved as faasd resolves it; status 0 when nothing
        answered."""
        parts = urllib.parse.urlsplit(url)
        ip = self.hosts().get(parts.hostname or "")
        if ip is not None:
            url = parts._replace(netloc=f"{ip}:{parts.port}" if parts.port else ip).geturl()
        return http_in_netns(self.pid, url, method=method, headers=headers, body=body)

    def faas_cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real faas-cli against faasd's gateway, with a HOME of its own (its login)."""
        env = {"HOME": str(self.cli_home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return self.run(
            [str(openfaas_bin() / "faas-cli"), *args, "--gateway", GATEWAY],
            input=input,
            env=env,
            timeout=180,
        )

    def ctr(self, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(["ctr", "-n", namespace, *args], timeout=600)

    def tasks(self, namespace: str, tries: int = 5) -> dict[str, str]:
        """Container name -> its task's status (RUNNING, STOPPED, ...) in a containerd namespace.

        containerd says UNKNOWN for a task whose shim did not answer within 2 s (a loaded
        machine): a passing state, as CREATED. A ``ctr`` that fails is asked again, up to
        ``tries`` times a second apart (an empty answer would read as "no task").

        Raises
        ------
        FaasdError
            ``ctr tasks ls`` failed every time (its last message)."""
        res = self.ctr(namespace, "tasks", "ls")
        for _ in range(tries - 1):
            if res.returncode == 0:
                break
            time.sleep(1)
            res = self.ctr(namespace, "tasks", "ls")
        if res.returncode != 0:
            raise FaasdError(f"ctr -n {namespace} tasks ls failed: {res.stderr.strip()}")
        out = {}
        for line in res.stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[0]] = parts[2]
        return out

    def endpoints(self, node: str) -> list[dict[str, Any]]:
        """The aggregator endpoints registered with ``node``'s gateway (``GET /v1/router``),
        the gateway's own left out."""
        admin = {"Authorization": f"Bearer {self.secret('gateway-admin-secret')}"}
        status, body = self.http(f"http://gateway-{node}:8081/v1/router", headers=admin)
        if status != 200:
            return []
        return [e for e in json.loads(body)["endpoints"] if not e["local"]]

    def import_image(self, namespace: str, ref: str) -> bool:
        """Make ``ref`` (podman's) whole in containerd's ``namespace``: imported unless its
        stamp and layers say it is there whole already (a stale copy deleted and collected
        first, then checked whole; :func:`tests.containers.faasd_root.import_running`).
        Whether it imported."""
        from tests.containerd_root import ContainerdError
        from tests.containers.faasd_root import import_running

        try:
            return import_running(CONTAINERD_ROOT, self.pid, namespace, ref)
        except ContainerdError as exc:
            raise FaasdError(f"could not copy image {ref} into containerd: {exc}") from None

    def script_imports(self) -> list[str]:
        """The images scripts/faasd-up.sh imported itself (its log's "importing" lines): none
        where the root was made whole before it ran."""
        log = self.run_dir / "logs" / "faasd-up.sh.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return [ln for ln in text.splitlines() if "faasd-up: importing " in ln]

    # -- functions ---------------------------------------------------------------------------------
    def login(self) -> None:
        user, password = self.basic_auth()
        res = self.faas_cli("login", "-u", user, "--password-stdin", input=password)
        if res.returncode != 0:
            raise FaasdError(f"faas-cli login failed: {res.stdout}{res.stderr}")

    def deploy(self, stack: Path, functions: Sequence[str], health_timeout: float = 180) -> None:
        """``faas-cli deploy -f stack --filter F`` for each of ``functions``, then each must
        pass its health check (:meth:`wait_healthy`).

        Raises
        ------
        FaasdError
            A function's image was not built, faasd refused the deployment (its message: a
            missing secret, an image it cannot find), or the function failed its health check
            (with its container's state and the end of its output).
        """
        images = stack_images(stack)
        unknown = [f for f in functions if f not in images]
        if unknown:
            raise FaasdError(f"{stack}: no function {', '.join(unknown)} in it")
        missing = [
            f"{f}: image {images[f]} was not built (run `make images`)"
            for f in functions
            if not image_exists(images[f])
        ]
        if missing:
            raise FaasdError(f"{stack.name}: " + "; ".join(missing))
        for f in functions:
            self.import_image("openfaas-fn", images[f])
            res = self.faas_cli("deploy", "-f", str(stack), "--filter", f)
            if res.returncode != 0 or "Deployed." not in res.stdout:
                said = " ".join((res.stdout + res.stderr).split())
                raise FaasdError(f"faasd refused function {f}: {said}")
        for f in functions:
            self.wait_healthy(f, health_timeout)

    def wait_healthy(self, function: str, timeout: float) -> None:
        """Until the function's own process answers through the gateway: ``GET
        /function/<function>`` with the function token, answered with anything but a 5xx.

        of-watchdog's ``/_/health`` is no such check: it answers 200 once the watchdog has
        written its lock file, before the function's process listens and after it has exited
        (of-watchdog keeps running then, and the gateway keeps routing to it).

        Raises
        ------
        FaasdError
            No answer within ``timeout`` seconds, the function's process exited (its watchdog
            logs "Forked function has terminated"), or its container stopped; the message
            names the function and ends with its output, which says why.
        """
        token = {"Authorization": f"Bearer {self.secret('function-token')}"}
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.http(f"{GATEWAY}/function/{function}", headers=token)
            if 0 < status < 500:
                return
            state = self.tasks("openfaas-fn").get(function, "no task")
            output = self.container_log("openfaas-fn", function)
            if state in ("STOPPED", "no task"):
                why = f"its container is {state}"
            elif "Forked function has terminated" in output:
                why = "its process exited"
            elif time.monotonic() > deadline:
                why = f"it gave no other answer in {timeout:.0f}s (its container is {state})"
            else:
                time.sleep(0.5)
                continue
            output = self.settled_log("openfaas-fn", function)
            said = f"{status}: {body.strip()[:200]}" if status else "nothing"
            raise FaasdError(
                f"function {function} failed its health check (GET /function/{function} with "
                f"its token answered {said}); {why}; its output ends:\n{output}"
            )

    # -- the end -----------------------------------------------------------------------------------
    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the namespace's PID 1 (faasd removes its services), SIGKILL after
        ``timeout`` seconds; then the cgroup folders faasd's containers leave are removed."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)  # the kernel ends the namespace
                    self.proc.wait(30)
            remove_cgroups(wait=60)
        finally:
            if self.lock is not None:
                self.lock.close()
                self.lock = None


def leftover_cgroups() -> list[Path]:
    """The cgroup folders faasd's containers make (``openfaas``, ``openfaas-fn`` and their
    children, under each controller) that exist now."""
    found: list[Path] = []
    for ctrl in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else ():
        for ns in CGROUP_NAMESPACES:
            top = ctrl / ns
            if top.is_dir() and not top.is_symlink():
                found += [p for p in top.iterdir() if p.is_dir()] + [top]
    return found


def remove_cgroups(wait: float = 0) -> None:
    """rmdir the empty cgroup folders faasd's containers left (children first); for up to
    ``wait`` seconds, again while some are left (a cgroup whose last process is still exiting
    is busy for a moment after its namespace has ended)."""
    deadline = time.monotonic() + wait
    while True:
        for path in leftover_cgroups():
            with contextlib.suppress(OSError):  # not empty: still in use (reported by the caller)
                path.rmdir()
        if time.monotonic() >= deadline or not leftover_cgroups():
            return
        time.sleep(0.2)


def job_result(stdout: str) -> dict[str, Any]:
    """The JSON document a job script printed last (tests/containers/faasd_job.py)."""
    return dict(json.loads(stdout.strip().splitlines()[-1]))
