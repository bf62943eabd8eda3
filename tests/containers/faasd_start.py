"""Starting faasd with FedFaaS's compose services in a namespace of the test's own.

:func:`start` installs ``deploy/faasd`` into a run folder (``deploy/faasd/prepare.py``), runs
``scripts/faasd-up.sh`` (containerd, ``faasd up`` and ``faasd provider`` as the PID 1 of a
private pid+mount+net namespace) and returns a :class:`~tests.containers.faasd_harness.Faasd`
once faasd's gateway and every FedFaaS service answer, each aggregator replica has registered
with its node gateway, and MinIO holds the bucket and the components' users.

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
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import yaml

from core.services import spawn
from tests.containerd_root import ContainerdError
from tests.containers.conftest import image_exists, stack_images
from tests.containers.faasd_harness import (
    CACHE,
    CONTAINERD_ROOT,
    GATEWAY,
    REPO,
    Faasd,
    FaasdError,
    openfaas_bin,
    remove_cgroups,
)
from tests.containers.faasd_root import prepare_root

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


def required_images(compose: Path) -> list[tuple[str, str]]:
    """``(containerd namespace, image)`` of every image a run needs: the compose file's
    services in ``openfaas``, the functions of :data:`FUNCTION_STACKS` in ``openfaas-fn``."""
    services = {("openfaas", ref) for ref in _compose_images(compose).values()}
    return sorted(services | {("openfaas-fn", ref) for ref in function_images().values()})


def async_images_built() -> bool:
    """Whether the stand-ins of NATS Streaming and the queue worker are in podman's store
    (``deploy/faasd/images.sh`` builds them where their binaries could be built)."""
    images = _compose_images(REPO / "deploy" / "faasd" / "docker-compose.yaml")
    return all(image_exists(images[s]) for s in ("nats", "queue-worker"))


def _init_pid(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """The namespace's PID 1: the child ``unshare --fork`` made (after the script's exec).

    A child counts only once it lives in another pid namespace than this process: before its
    exec the script forks short-lived subshells (``$(realpath ...)``) that are children too,
    and taking one of those for PID 1 (seen once under CI) leaves a pid that is gone."""
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    ours = os.readlink("/proc/self/ns/pid")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for kid in path.read_text().split():
                if os.readlink(f"/proc/{kid}/ns/pid") != ours:
                    return int(kid)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise FaasdError("scripts/faasd-up.sh made no namespace")


def _tail(path: Path, lines: int = 25) -> str:
    return (
        "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
    )


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
    images = required_images(work / "docker-compose.yaml")
    missing = sorted(ref for _, ref in images if not image_exists(ref))
    if missing:
        raise FaasdError(
            f"images not built: {', '.join(missing)} (run `make images` and deploy/faasd/images.sh)"
        )
    (run_dir / "images.list").write_text("".join(f"{ns} {ref}\n" for ns, ref in images))
    remove_cgroups()  # a run that was killed may have left empty ones
    # containerd's root in the cache: an image podman has not changed is imported once, by
    # prepare_root (crash-safe, tests/containerd_root.py), so that the script imports none
    try:
        imported, rebuilt = prepare_root(CONTAINERD_ROOT, images, run_dir / "containerd-root")
    except ContainerdError as exc:
        raise FaasdError(f"containerd's root {CONTAINERD_ROOT}: {exc}") from None
    env = {
        **os.environ,
        "FEDFAAS_FAASD": str(faasd),
        "FEDFAAS_FAASD_CONTAINERD_ROOT": str(CONTAINERD_ROOT),
    }
    proc = spawn(
        ["bash", str(REPO / "scripts" / "faasd-up.sh"), str(run_dir)],
        log_path=run_dir / "logs" / "faasd-up.sh.log",
        env=env,
    )
    try:
        fd = Faasd(run_dir, proc, _init_pid(proc), with_async, lock, imported, rebuilt)
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
            if state not in ("RUNNING", "not started", "CREATED", "UNKNOWN"):
                raise FaasdError(
                    f"compose service {name} is {state}; its output ends:\n"
                    f"{fd.container_log('openfaas', name)}"
                )
            check_alive(f"waiting for {name} (:{port}/healthz)")
            time.sleep(0.5)
    # each aggregator replica registered its endpoints through the socket folder it shares
    # with its node gateway, and the control plane sees both nodes healthy
    for node in ("node0", "node1"):
        while not fd.endpoints(node):
            check_alive(f"waiting for aggregator-{node} to register with gateway-{node}")
            time.sleep(0.5)
    analyst = {"Authorization": f"Bearer {fd.secret('analyst-token')}"}
    while True:
        status, body = fd.http("http://control-plane:8070/v1/nodes", headers=analyst)
        if status == 200 and [n["healthy"] for n in json.loads(body)["nodes"]] == [True, True]:
            break
        check_alive("waiting for the control plane to see both node gateways healthy")
        time.sleep(0.5)
    # the bucket and the components' MinIO users: a one-shot service; the gateways' user
    # reaching the bucket shows it has done its work
    check = [sys.executable, "-c", _BUCKET, str(fd.secrets / "minio-gateway.json")]
    while True:
        # its state read before the check: a task that had ended before the check ran had
        # done all it would, so a check failing then is final (read after, a task that
        # finished just after a failed check would look failed)
        state = fd.tasks("openfaas").get("minio-provision")
        try:
            res = fd.run(check, timeout=60)
        except subprocess.TimeoutExpired:  # a MinIO too busy to answer: ask again
            check_alive("waiting for minio-provision (a check timed out)")
            continue
        if res.returncode == 0:
            break
        if state == "STOPPED":  # not made yet (None), CREATED or RUNNING: wait
            raise FaasdError(
                f"minio-provision ended, and the gateways' MinIO user cannot reach the bucket "
                f"({res.stderr.strip()[-300:]}); its output ends:\n"
                f"{fd.container_log('openfaas', 'minio-provision')}"
            )
        check_alive("waiting for minio-provision")
        time.sleep(0.5)


_BUCKET = """
import sys
from minio import Minio
from core.checkpoints import retrying_http
from core.secretfiles import read_credentials
c = read_credentials(__import__("pathlib").Path(sys.argv[1]), "MinIO")
# a busy MinIO's 503 asked again within seconds, never after its Retry-After's minute
mc = Minio("minio:9000", c.username, c.password, secure=False, http_client=retrying_http())
sys.exit(0 if mc.bucket_exists("fedfaas") else 1)
"""
