"""Shared helpers of the container tests: podman with FedFaaS's own configuration and storage
(``scripts/containers-env.sh``: nothing under the host's /etc, /var/lib or /run), containers
reached through their own network namespace, and a check that images were built.

Public helpers (other container tests use them; keep their signatures):

- :func:`container_env` the environment of ``scripts/containers-env.sh`` (CONTAINERS_CONF, ...)
- :func:`require_tool` a program on PATH; skips where missing, fails under CI (``CI`` set)
- :func:`podman` runs podman in that environment
- :func:`image_exists`, :func:`missing_images` whether images are in podman's store
- :func:`stack_images` each function of a stack file and its image, as faas-cli resolves it
- :class:`Container`, :func:`run_container` a detached container, stopped and removed after
- :func:`http_in_netns` an HTTP request made from inside a container's network namespace
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.openfaas.conftest import under_ci
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO / "scripts" / "containers-env.sh"
#: the variables containers-env.sh exports (PATH: its wrappers of podman, buildah and skopeo)
ENV_NAMES = (
    "PATH",
    "FEDFAAS_CONTAINERS",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "FEDFAAS_SIGNATURE_POLICY",
)


@cache
def _sourced(cache_dir: str | None) -> tuple[tuple[str, str], ...]:
    env = dict(os.environ)
    if cache_dir is not None:
        env["FEDFAAS_CACHE"] = cache_dir
    out = subprocess.run(
        ["bash", "-c", f'. "{ENV_SCRIPT}" && env -0'],
        env=env,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    exported = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
    return tuple((name, exported[name]) for name in ENV_NAMES)


def container_env(cache_dir: Path | None = None) -> dict[str, str]:
    """``os.environ`` plus what ``scripts/containers-env.sh`` exports (it is sourced, so the
    configuration files exist afterwards). ``cache_dir`` stands for ``$FEDFAAS_CACHE``."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["FEDFAAS_CACHE"] = str(cache_dir)
    env.update(_sourced(None if cache_dir is None else str(cache_dir)))
    return env


def require_tool(name: str) -> Path:
    """The program ``name`` on the PATH of :func:`container_env` (podman, buildah and skopeo:
    containers-env.sh's wrappers); skips the test where it is missing, fails under CI (``make
    setup`` installs the container packages: a CI run must not pass without them)."""
    found = shutil.which(name, path=container_env()["PATH"])
    if found:
        return Path(found)
    reason = f"{name} is not installed (scripts/setup.sh installs the container packages)"
    if under_ci():
        pytest.fail(f"under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def podman(
    *args: str,
    check: bool = True,
    timeout: float = 120,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` in :func:`container_env` (or ``env``); output as text. With ``check`` a
    non-zero exit fails the test with podman's stderr."""
    res = subprocess.run(
        [str(require_tool("podman")), *args],
        env=dict(env) if env is not None else container_env(),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {res.returncode}\n{res.stderr}")
    return res


def image_exists(ref: str) -> bool:
    """Whether ``ref`` is in podman's store (FedFaaS's, :func:`container_env`)."""
    return podman("image", "exists", ref, check=False).returncode == 0


def stack_images(
    stack: Path, registry: str | None = None, tag: str | None = None
) -> dict[str, str]:
    """Function name -> image of ``stack``, ``${VAR:-default}`` expanded as faas-cli does with
    FEDFAAS_REGISTRY / FEDFAAS_TAG set to ``registry`` / ``tag`` (or their defaults)."""
    values = {"FEDFAAS_REGISTRY": registry, "FEDFAAS_TAG": tag}

    def expand(m: re.Match[str]) -> str:
        return values.get(m.group(1)) or m.group(2)

    functions = yaml.safe_load(stack.read_text())["functions"]
    return {
        name: re.sub(r"\$\{(\w+):-([^}]*)\}", expand, fn["image"]) for name, fn in functions.items()
    }


def missing_images(images: Mapping[str, str] | Iterable[str]) -> list[str]:
    """A message for each image not in podman's store, naming it (and, given a mapping from
    stack entries to images, the entry): empty when all were built."""
    pairs = images.items() if isinstance(images, Mapping) else ((ref, ref) for ref in images)
    return [
        (f"{entry}: image {ref} was not built" if entry != ref else f"image {ref} was not built")
        + " (run `make images`)"
        for entry, ref in pairs
        if not image_exists(ref)
    ]


@dataclass
class Container:
    """A running container: its name, id and main process (in the host's pid namespace)."""

    name: str
    id: str
    pid: int

    def logs(self) -> str:
        res = podman("logs", self.id, check=False)
        return res.stdout + res.stderr

    def running(self) -> bool:
        res = podman("inspect", "--format", "{{.State.Running}}", self.id, check=False)
        return res.stdout.strip() == "true"


@contextmanager
def run_container(
    image: str,
    *command: str,
    name: str,
    network: str = "none",
    env: Mapping[str, str] | None = None,
    mounts: Sequence[tuple[Path, str]] = (),
    options: Sequence[str] = (),
) -> Iterator[Container]:
    """``podman run -d`` of ``image`` (``command`` when given), its own network namespace by
    default (``--network none``: loopback only, reached with :func:`http_in_netns`);
    ``mounts`` are read-only bind mounts (host path, container path). Stopped and removed on
    exit, whatever happened."""
    # --no-healthcheck: podman runs an image's HEALTHCHECK (the template's) through systemd
    # timers, absent here; the tests ask the container themselves
    argv = ["run", "-d", "--no-healthcheck", "--name", name, "--network", network]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    for host, inside in mounts:
        argv += ["--volume", f"{host}:{inside}:ro,Z"]
    argv += [*options, image, *command]
    podman("rm", "--force", "--ignore", name, check=False)
    cid = podman(*argv).stdout.strip()
    try:
        state = json.loads(podman("inspect", "--format", "{{json .State}}", cid).stdout)
        if not state.get("Running"):
            logs = podman("logs", cid, check=False)
            raise AssertionError(f"{image} exited at once: {logs.stdout}{logs.stderr}")
        yield Container(name=name, id=cid, pid=int(state["Pid"]))
    finally:
        podman("rm", "--force", "--time", "5", cid, check=False, timeout=60)


_HTTP = """
import json, sys, urllib.error, urllib.request
url, method, headers, body = json.loads(sys.stdin.read())
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


def http_in_netns(
    pid: int,
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: str | None = None,
) -> tuple[int, str]:
    """``(status, body)`` of an HTTP request made by this Python from inside the network
    namespace of process ``pid`` (``nsenter --net``: the files and the interpreter stay the
    host's). Status 0 when nothing answered (the body says why)."""
    res = subprocess.run(
        [str(require_tool("nsenter")), f"--net=/proc/{pid}/ns/net", sys.executable, "-c", _HTTP],
        input=json.dumps([url, method, dict(headers or {}), body]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    status, text = json.loads(res.stdout)
    return int(status), str(text)


def wait_for_http(
    pid: int, url: str, timeout: float = 60.0, headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """Poll :func:`http_in_netns` (GET) until something answers (any status); that answer."""
    answer: list[tuple[int, str]] = []

    def answered() -> bool:
        answer[:] = [http_in_netns(pid, url, headers=headers)]
        return answer[0][0] != 0

    wait_until(answered, timeout=timeout, interval=0.5)
    return answer[0]
