"""faasd with FedFaaS's compose services, in a namespace of the test's own.

:func:`start` installs ``deploy/faasd`` into a run folder (``deploy/faasd/prepare.py``), starts
``scripts/faasd-up.sh`` (faasd 0.19.0, its containerd and provider as the PID 1 of a private
pid+mount+net namespace) and waits until faasd's gateway and every FedFaaS service answer.
:class:`Faasd` then runs programs inside that namespace (:meth:`Faasd.run`: ``nsenter`` into its
network and mounts, where the services' names resolve), deploys functions with the real
``faas-cli`` (:meth:`Faasd.deploy`: images checked first, health checked after) and stops
everything (:meth:`Faasd.stop`): the namespace's PID 1 ends, the kernel ends the rest, and the
cgroup folders faasd's containers leave are removed.

faasd names its containers' cgroups ``/openfaas/<name>``: one faasd per machine at a time, which
:func:`start` makes sure of with a lock file in the FedFaaS cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from fedfaas.services import spawn
from tests.containers.conftest import image_exists, stack_images

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))
FAASD_BIN = CACHE / "bin" / "faasd"
#: compose services of FedFaaS and the port each answers ``/healthz`` on
SERVICES = {
    "gateway-node0": 8081,
    "gateway-node1": 8081,
    "cache-engine": 8091,
    "request-tracker": 8092,
    "control-plane": 8070,
}
#: functions whose images go into containerd's ``openfaas-fn`` namespace at start
FUNCTION_STACKS = {
    "echo": "stack.yml",
    "digits-evaluator": "stack.yml",
    "flstore": "stack.platform.yml",
}
GATEWAY = "http://127.0.0.1:8080"
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


def faasd_binary() -> Path | None:
    """faasd 0.19.0, unpacked once into the cache from ``faasd.xz``; None where neither is."""
    if FAASD_BIN.is_file():
        return FAASD_BIN
    packed = openfaas_bin() / "faasd.xz"
    if not packed.is_file():
        return None
    FAASD_BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = FAASD_BIN.with_suffix(".tmp")
    with lzma.open(packed) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.chmod(0o755)
    tmp.replace(FAASD_BIN)
    return FAASD_BIN


def _compose_images(compose: Path) -> dict[str, str]:
    services = yaml.safe_load(compose.read_text())["services"]
    return {name: svc["image"] for name, svc in services.items()}


def function_images() -> dict[str, str]:
    """The images of :data:`FUNCTION_STACKS`, as faas-cli names them."""
    return {fn: stack_images(REPO / stack)[fn] for fn, stack in FUNCTION_STACKS.items()}


def async_images_built() -> bool:
    """Whether the stand-ins of NATS Streaming and the queue worker are in podman's store
    (``deploy/faasd/images.sh`` builds them where their binaries could be built)."""
    images = _compose_images(REPO / "deploy" / "faasd" / "docker-compose.yaml")
    return all(image_exists(images[s]) for s in ("nats", "queue-worker"))


@dataclass
class Faasd:
    """A running faasd in its own namespace (see :func:`start`)."""

    run_dir: Path
    proc: subprocess.Popen[bytes]
    #: the namespace's PID 1, as this process sees it
    pid: int
    with_async: bool
    lock: IO[bytes] | None = field(default=None, repr=False)
    cli_home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.cli_home = self.run_dir / "faas-cli-home"
        self.cli_home.mkdir(exist_ok=True)

    # -- where things are -------------------------------------------------------------------------
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

    def hosts(self) -> dict[str, str]:
        """Compose service name -> its address on faasd's bridge (faasd's hosts file)."""
        out = {}
        for line in (self.workdir / "hosts").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[1]] = parts[0]
        return out

    def container_log(self, namespace: str, name: str, lines: int = 30) -> str:
        """The last ``lines`` of a container's output (scripts/faasd-up.sh's log driver)."""
        path = self.run_dir / "logs" / "containers" / namespace / f"{name}.log"
        if not path.exists():
            return f"(no output of {namespace}/{name})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- running things inside ----------------------------------------------------------------------
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

    def http(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
        auth: tuple[str, str] | None = None,
    ) -> tuple[int, str]:
        """``(status, body)`` of one HTTP request from inside; status 0 when nothing answered."""
        res = self.run(
            [sys.executable, "-c", _HTTP],
            input=json.dumps([url, method, dict(headers or {}), body, auth]),
            timeout=60,
        )
        if res.returncode != 0:
            return 0, res.stderr
        status, text = json.loads(res.stdout)
        return int(status), str(text)

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

    def tasks(self, namespace: str) -> dict[str, str]:
        """Container name -> its task's status (RUNNING, STOPPED, ...) in a containerd namespace."""
        out = {}
        for line in self.ctr(namespace, "tasks", "ls").stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[0]] = parts[2]
        return out

    def has_image(self, namespace: str, ref: str) -> bool:
        return ref in self.ctr(namespace, "images", "ls", "-q").stdout.split()

    def import_image(self, namespace: str, ref: str) -> None:
        """Copy ``ref`` from podman's store into containerd's ``namespace``."""
        script = (
            f'. "{REPO}/scripts/containers-env.sh" && podman save --format oci-archive '
            f'"{ref}" | ctr -n {namespace} images import --all-platforms -'
        )
        res = self.run(["bash", "-c", script], timeout=900)
        if res.returncode != 0:
            raise FaasdError(f"could not copy image {ref} into containerd: {res.stderr.strip()}")

    # -- functions --------------------------------------------------------------------------------------
    def login(self) -> None:
        user, password = self.basic_auth()
        res = self.faas_cli("login", "-u", user, "--password-stdin", input=password)
        if res.returncode != 0:
            raise FaasdError(f"faas-cli login failed: {res.stdout}{res.stderr}")

    def deploy(self, stack: Path, functions: Sequence[str], health_timeout: float = 180) -> None:
        """``faas-cli deploy -f stack --filter F`` for each of ``functions``, then each must
        answer its health check through the gateway (of-watchdog's ``/_/health``).

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
            if not self.has_image("openfaas-fn", images[f]):
                self.import_image("openfaas-fn", images[f])
            res = self.faas_cli("deploy", "-f", str(stack), "--filter", f)
            if res.returncode != 0 or "Deployed." not in res.stdout:
                said = " ".join((res.stdout + res.stderr).split())
                raise FaasdError(f"faasd refused function {f}: {said}")
        for f in functions:
            self.wait_healthy(f, health_timeout)

    def wait_healthy(self, function: str, timeout: float) -> None:
        """Until ``GET /function/<function>/_/health`` answers 200 through the gateway.

        Raises
        ------
        FaasdError
            It did not within ``timeout`` seconds, or the function's container stopped.
        """
        deadline = time.monotonic() + timeout
        last: tuple[int, str] = (0, "")
        while True:
            last = self.http(f"{GATEWAY}/function/{function}/_/health")
            if last[0] == 200:
                return
            state = self.tasks("openfaas-fn").get(function, "no task")
            if state != "RUNNING" or time.monotonic() > deadline:
                why = (
                    f"its container is {state}"
                    if state != "RUNNING"
                    else f"no answer 200 in {timeout:.0f}s"
                )
                raise FaasdError(
                    f"function {function} failed its health check (GET /function/{function}/_/health "
                    f"answered {last[0] or 'nothing'}: {last[1].strip()[:200]}); {why}; its output "
                    f"ends:\n{self.container_log('openfaas-fn', function)}"
                )
            time.sleep(0.5)

    # -- the end -------------------------------------------------------------------------------------
    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the namespace's PID 1 (faasd removes its services), SIGKILL after
        ``timeout`` seconds; then the cgroup folders and containerd's files are removed."""
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
            remove_cgroups()
            # the images' unpacked layers: gigabytes
            shutil.rmtree(self.run_dir / "containerd", ignore_errors=True)
            shutil.rmtree(
                self.run_dir / "ovl" / "var-lib" / "upper" / "faasd-provider", ignore_errors=True
            )
        finally:
            if self.lock is not None:
                self.lock.close()
                self.lock = None


_HTTP = """
import base64, json, sys, urllib.error, urllib.request
url, method, headers, body, auth = json.loads(sys.stdin.read())
if auth:
    headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
req = urllib.request.Request(url, data=body.encode() if body is not None else None,
                             method=method, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(json.dumps([r.status, r.read().decode(errors="replace")]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, e.read().decode(errors="replace")]))
except OSError as e:
    print(json.dumps([0, repr(e)]))
"""


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


def remove_cgroups() -> None:
    """rmdir the empty cgroup folders faasd's containers left (children first)."""
    for path in leftover_cgroups():
        with contextlib.suppress(OSError):  # not empty: still in use (reported by the caller)
            path.rmdir()


def _init_pid(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """The namespace's PID 1: the child ``unshare --fork`` made (after the script's exec)."""
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            kids = path.read_text().split()
            if kids:
                return int(kids[0])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise FaasdError("scripts/faasd-up.sh made no namespace")


def _tail(path: Path, lines: int = 25) -> str:
    return (
        "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
    )


@contextlib.contextmanager
def running(run_dir: Path, with_async: bool, timeout: float = 600) -> Iterator[Faasd]:
    """:func:`start`, and :meth:`Faasd.stop` on exit whatever happened."""
    fd = start(run_dir, with_async, timeout)
    try:
        yield fd
    finally:
        fd.stop()


def start(run_dir: Path, with_async: bool, timeout: float = 600) -> Faasd:
    """faasd with FedFaaS's services in a new namespace, once every one answers.

    Parameters
    ----------
    run_dir
        An empty folder for this run (containerd's files, the overlays' writes, the logs).
    with_async
        Also NATS Streaming and the queue worker (their stand-in images must exist).
    timeout
        Seconds for the images' import and every service to answer.

    Raises
    ------
    FaasdError
        A missing binary or image, or a part that did not start (naming it, with its log).
    """
    faasd = faasd_binary()
    if faasd is None:
        raise FaasdError(f"no faasd: neither {FAASD_BIN} nor {openfaas_bin() / 'faasd.xz'}")
    CACHE.mkdir(parents=True, exist_ok=True)
    lock = open(CACHE / "faasd.lock", "wb")  # noqa: SIM115 - held for the run's lifetime
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        return _start(run_dir, with_async, timeout, faasd, lock)
    except BaseException:
        lock.close()
        raise


def _start(run_dir: Path, with_async: bool, timeout: float, faasd: Path, lock: IO[bytes]) -> Faasd:
    work = run_dir / "ovl" / "var-lib" / "upper" / "faasd"
    work.mkdir(parents=True)
    (work / "resolv.conf").write_text("nameserver 127.0.0.1\n")  # no DNS in the namespace
    prep = subprocess.run(
        [
            sys.executable,
            str(REPO / "deploy" / "faasd" / "prepare.py"),
            str(work),
            *([] if with_async else ["--no-async"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if prep.returncode != 0:
        raise FaasdError(f"deploy/faasd/prepare.py failed: {prep.stderr}")
    images = {f"openfaas {ref}" for ref in _compose_images(work / "docker-compose.yaml").values()}
    images |= {f"openfaas-fn {ref}" for ref in function_images().values()}
    missing = sorted(i.split()[1] for i in images if not image_exists(i.split()[1]))
    if missing:
        raise FaasdError(
            f"images not built: {', '.join(missing)} (run `make images` and deploy/faasd/images.sh)"
        )
    (run_dir / "images.list").write_text("".join(f"{i}\n" for i in sorted(images)))
    remove_cgroups()  # a run that was killed may have left empty ones
    env = {**os.environ, "FEDFAAS_FAASD": str(faasd)}
    proc = spawn(
        ["bash", str(REPO / "scripts" / "faasd-up.sh"), str(run_dir)],
        log_path=run_dir / "logs" / "faasd-up.sh.log",
        env=env,
    )
    try:
        fd = Faasd(run_dir, proc, _init_pid(proc), with_async, lock)
    except FaasdError as exc:
        proc.kill()
        proc.wait(30)
        raise FaasdError(f"{exc}: {_tail(run_dir / 'logs' / 'faasd-up.sh.log')}") from None
    try:
        _wait_ready(fd, timeout)
    except BaseException:
        fd.lock = None  # the caller closes it
        fd.stop()
        raise
    return fd


def _wait_ready(fd: Faasd, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    logs = fd.run_dir / "logs"

    def check_alive(what: str) -> None:
        if fd.proc.poll() is not None:
            raise FaasdError(
                f"faasd stopped while {what}:\n{_tail(logs / 'faasd-up.sh.log')}\n"
                f"faasd up: {_tail(logs / 'faasd-up.log', 10)}"
            )
        if time.monotonic() > deadline:
            raise FaasdError(
                f"not ready in {timeout:.0f}s: {what}\n{_tail(logs / 'faasd-up.sh.log')}"
            )

    while not (fd.run_dir / "started").exists():
        check_alive("importing images and starting faasd")
        time.sleep(0.5)
    while fd.http(f"{GATEWAY}/healthz")[0] != 200:
        check_alive("waiting for the OpenFaaS gateway (127.0.0.1:8080)")
        time.sleep(0.5)
    for name, port in SERVICES.items():
        while fd.http(f"http://{name}:{port}/healthz")[0] != 200:
            state = fd.tasks("openfaas").get(name, "not started")
            if state not in ("RUNNING", "not started", "CREATED"):
                raise FaasdError(
                    f"compose service {name} is {state}; its output ends:\n"
                    f"{fd.container_log('openfaas', name)}"
                )
            check_alive(f"waiting for {name} (:{port}/healthz)")
            time.sleep(0.5)
    # the bucket and the components' MinIO users: a one-shot service that must have exited 0
    while fd.tasks("openfaas").get("minio-provision") == "RUNNING":
        check_alive("waiting for minio-provision")
        time.sleep(0.5)
    said = fd.container_log("openfaas", "minio-provision")
    if "Traceback" in said or "error" in said.lower():
        raise FaasdError(f"minio-provision failed:\n{said}")


def job_result(stdout: str) -> dict[str, Any]:
    """The JSON document a job script printed last (tests/containers/faasd_job.py)."""
    return dict(json.loads(stdout.strip().splitlines()[-1]))
