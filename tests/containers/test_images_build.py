"""``make images`` for real: scripts/images.sh builds the services image and a function image with
podman (in FedFaaS's own store, scripts/containers-env.sh), and each runs in a container of its
own network namespace: the control plane answers ``/healthz`` and refuses a request without its
token; the ``echo`` function answers 200 with its token (a secret file, mounted where OpenFaaS
mounts it) and 401 without. The CA bundle given to the builds is in none of their layers; a
failed build names the image and the step; ``images.sh check`` names a function whose image
was not built.

The builds run in a copy of the repository (faas-cli writes ``build/`` there), with the tags
``localhost/fedfaas-test/<name>:test``, removed afterwards; their layers are the ones ``make
images`` caches, so after it these builds take seconds (from nothing: minutes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.conftest import (
    REPO,
    container_env,
    http_in_netns,
    podman,
    require_tool,
    run_container,
    wait_for_http,
)
from tests.openfaas.conftest import require_binary
from tests.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REGISTRY = "localhost/fedfaas-test"
TAG = "test"
SERVICES = f"{REGISTRY}/fedfaas:{TAG}"
ECHO = f"{REGISTRY}/echo:{TAG}"
APP_UID = 12000  # both Dockerfiles' user (tests/test_images.py holds them to the chart's)
#: host folders that podman, buildah and runc use by default, and FedFaaS's setup must not
HOST_FOLDERS = [Path("/var/lib/containers"), Path("/run/containers"), Path("/run/runc")]


def repo_copy(dest: Path) -> Path:
    """The repository without dot folders, tests and build output."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(
            ".*", "__pycache__", "*.pyc", "build", "tests", "results", "*.egg-info"
        ),
    )
    return dest


def images_sh(
    tree: Path, *args: str, images: str, tag: str = TAG, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``scripts/images.sh ARGS`` of ``tree`` with podman, IMAGES=``images`` and ``variables``
    (CA_BUNDLE: the system's, as ``make images`` gives by default)."""
    env = container_env()
    env.pop("CA_BUNDLE", None)
    env.update(
        ENGINE="podman",
        REGISTRY=REGISTRY,
        TAG=tag,
        IMAGES=images,
        FEDFAAS_OPENFAAS_BIN=str(require_binary("faas-cli").parent),
        **variables,
    )
    return subprocess.run(
        ["bash", str(tree / "scripts" / "images.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )


def marked_ca_bundle(folder: Path) -> tuple[Path, bytes]:
    """The system CA bundle (which pip needs behind this machine's proxy) with a unique line
    outside its certificates: found in a layer, it would say the bundle leaked into it."""
    marker = f"# fedfaas-ca-marker-{uuid.uuid4().hex}".encode()
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    bundle = folder / "ca.crt"
    bundle.write_bytes((system.read_bytes() if system.is_file() else b"") + b"\n" + marker + b"\n")
    return bundle, marker


def layers_containing(image: str, needle: bytes, folder: Path) -> list[str]:
    """The layers of ``image`` (``podman save``) holding ``needle`` in a file's content or name."""
    archive = folder / "image.tar"
    podman("save", "--format", "docker-archive", "-o", str(archive), image, timeout=600)
    found = []
    with tarfile.open(archive) as outer:
        for member in outer:
            if not member.name.endswith(".tar"):
                continue
            layer = outer.extractfile(member)
            assert layer is not None
            with tarfile.open(fileobj=layer, mode="r|") as inner:
                for entry in inner:
                    data = inner.extractfile(entry) if entry.isfile() else None
                    content = data.read() if data is not None else b""
                    if needle in content or needle in entry.name.encode():
                        found.append(f"{member.name}: {entry.name}")
    archive.unlink()
    return found


def secret_file(folder: Path, name: str, value: str) -> Path:
    """A 0600 secret file the images' user (uid 12000) owns, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, APP_UID, APP_UID)
    path = folder / name
    path.write_text(value)
    path.chmod(0o600)
    os.chown(path, APP_UID, APP_UID)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The services image and ``echo`` built by scripts/images.sh (the repo copy it used, its
    output, and which of :data:`HOST_FOLDERS` existed before)."""
    require_tool("podman")
    folder = tmp_path_factory.mktemp("images")
    existed = {p: p.exists() for p in HOST_FOLDERS}
    tree = repo_copy(folder / "repo")
    res = images_sh(tree, images="fedfaas echo")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    try:
        yield {"output": res.stdout, "tree": tree, "existed": existed}
    finally:
        podman("rmi", "--force", SERVICES, ECHO, check=False)


def test_images_sh_reports_each_image_built_with_its_size(built: dict[str, object]) -> None:
    output = str(built["output"])
    rows = dict(re.findall(r"^(\S+)\s+(\d+) MB$", output, flags=re.M))
    assert set(rows) == {SERVICES, ECHO}, output[-2000:]
    for image, mb in rows.items():
        size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
        assert int(mb) == size // 1_000_000 and size > 0


def test_the_ca_bundle_is_in_no_layer_and_the_host_folders_stay_untouched(
    built: dict[str, object], tmp_path: Path
) -> None:
    """``echo`` built again, every step (its pip steps read the bundle: behind this machine's
    proxy they fail without it), with a marked bundle that no layer may hold."""
    bundle, marker = marked_ca_bundle(tmp_path)
    image = f"{REGISTRY}/echo:ca"
    tree = Path(str(built["tree"]))
    res = images_sh(tree, images="echo", tag="ca", CA_BUNDLE=str(bundle), NO_CACHE="1")
    try:
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        assert "Successfully installed" in res.stdout  # pip ran, it did not come from a cache
        assert layers_containing(image, marker, tmp_path) == []
        history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
        assert marker.decode() not in history and str(bundle) not in history
    finally:
        podman("rmi", "--force", image, check=False)
    existed = built["existed"]
    assert isinstance(existed, dict)
    for path, was in existed.items():
        assert path.exists() == was, f"the build {'removed' if was else 'created'} {path}"


def test_the_services_image_serves_the_control_plane(
    built: dict[str, object], tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    secrets = tmp_path / "secrets"
    secret_file(secrets, "admin-token", token)
    with run_container(
        SERVICES,
        *("python", "-m", "control_plane", "--host", "127.0.0.1", "--port", "8070"),
        *("--gateways-service", "nodes.invalid:8000"),
        *("--admin-token-file", "/run/secrets/fedfaas/admin-token"),
        name=f"fedfaas-test-control-{uuid.uuid4().hex[:8]}",
        mounts=[(secrets, "/run/secrets/fedfaas")],
        options=["--read-only", "--pull", "never"],
    ) as box:
        # the chart's user and no torch: the image runs the module as uid 12000
        assert podman("exec", box.id, "id", "-u").stdout.strip() == str(APP_UID)
        res = podman("exec", box.id, "python", "-c", "import torch", check=False)
        assert res.returncode != 0 and "No module named 'torch'" in res.stderr
        status, body = wait_for_http(box.pid, "http://127.0.0.1:8070/healthz")
        assert (status, body) == (200, '{"status":"ok"}'), box.logs()
        status, body = http_in_netns(box.pid, "http://127.0.0.1:8070/v1/nodes")
        assert status == 401 and '"unauthorized"' in body
        status, body = http_in_netns(
            box.pid,
            "http://127.0.0.1:8070/v1/nodes",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert status == 200 and '"nodes"' in body


def test_the_function_image_answers_with_its_token_only(
    built: dict[str, object], tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    secrets = tmp_path / "openfaas-secrets"
    secret_file(secrets, "fedfaas-function-token", token)
    with run_container(
        ECHO,
        name=f"fedfaas-test-echo-{uuid.uuid4().hex[:8]}",
        mounts=[(secrets, "/var/openfaas/secrets")],
        options=["--pull", "never"],
    ) as box:
        url = "http://127.0.0.1:8080/"
        bearer = {"Authorization": f"Bearer {token}"}

        def ready() -> bool:  # of-watchdog answers before its upstream (waitress) listens
            return http_in_netns(box.pid, url, headers=bearer)[0] == 200

        wait_until(ready, timeout=60, interval=0.5)
        status, body = http_in_netns(box.pid, url, method="POST", headers=bearer, body="hello")
        assert (status, body) == (200, "hello"), box.logs()
        status, body = http_in_netns(box.pid, url, method="POST", body="hello")
        assert status == 401 and "Bearer" in body
        status, _ = http_in_netns(
            box.pid, url, method="POST", headers={"Authorization": "Bearer wrong"}, body="x"
        )
        assert status == 401


def test_a_failed_build_names_the_image_and_the_step(
    built: dict[str, object], tmp_path: Path
) -> None:
    tree = repo_copy(tmp_path / "repo")
    (tree / "functions" / "echo" / "handler_test.py").write_text(
        "def test_fails():\n    assert False, 'this function fails its tests'\n"
    )
    res = images_sh(tree, images="echo", tag="broken")
    assert res.returncode == 1
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("images: ")]
    assert len(said) == 1, res.stderr[-3000:]
    m = re.fullmatch(
        rf"images: {re.escape(REGISTRY)}/echo:broken: failed at step (\d+)/(\d+) of stage "
        r"(\d+)/(\d+): (.*)",
        said[0],
    )
    assert m, said[0]
    step, stage, instruction = int(m.group(1)), int(m.group(3)), m.group(5)
    assert "TEST_ENABLED" in instruction and instruction.startswith("RUN ")
    # the step the message names is that instruction of the template's Dockerfile
    stages: list[list[str]] = []
    text = (REPO / "template" / "python3-http" / "Dockerfile").read_text()
    for line in text.replace("\\\n", " ").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    assert "TEST_ENABLED" in stages[stage - 1][step - 1] and stages[stage - 1][step - 1].startswith(
        "RUN "
    )
    assert "this function fails its tests" in res.stdout


def test_check_names_a_stack_entry_whose_image_was_not_built(
    built: dict[str, object], tmp_path: Path
) -> None:
    stack = tmp_path / "stack.yml"
    missing = f"{REGISTRY}/never-built:{uuid.uuid4().hex[:8]}"
    stack.write_text(
        "version: 1.0\nprovider:\n  name: openfaas\n  gateway: http://127.0.0.1:8080\n"
        "functions:\n"
        f"  echo:\n    lang: python3-http\n    handler: ./functions/echo\n    image: {ECHO}\n"
        f"  ghost:\n    lang: python3-http\n    handler: ./functions/echo\n    image: {missing}\n"
    )
    res = images_sh(REPO, "check", str(stack), images="")
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"images: {stack}: function ghost: image {missing} was not built (podman has no such "
        "image; `make images` builds it)"
    )
