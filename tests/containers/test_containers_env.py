"""scripts/containers-env.sh: podman's configuration, storage and state under FedFaaS's cache,
written once, and nothing written to the host's /var/lib or /run (podman's, buildah's and runc's
defaults as root). Each test sources it with a cache folder of its own."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.containers.conftest import ENV_SCRIPT, container_env, podman, require_tool

pytestmark = pytest.mark.integration

#: what podman, buildah, containers/image and runc write to by default as root
HOST_FOLDERS = [
    Path("/var/lib/containers"),
    Path("/run/containers"),
    Path("/run/libpod"),
    Path("/run/runc"),
    Path("/etc/containers/networks"),
]


def sourced(cache: Path, command: str = "true") -> str:
    """The output of ``COMMAND`` after sourcing containers-env.sh with FEDFAAS_CACHE=cache."""
    env = {"HOME": str(cache), "FEDFAAS_CACHE": str(cache), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    res = subprocess.run(
        ["bash", "-c", f'. "{ENV_SCRIPT}" && {command}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_configuration_is_written_once_under_the_cache(tmp_path: Path) -> None:
    out = sourced(tmp_path, 'echo "$PATH"; env | grep ^CONTAINERS_ | sort')
    folder = tmp_path / "containers"
    assert out.splitlines() == [
        f"{folder}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"CONTAINERS_CONF={folder}/containers.conf",
        f"CONTAINERS_REGISTRIES_CONF={folder}/registries.conf",
        f"CONTAINERS_STORAGE_CONF={folder}/storage.conf",
    ]
    conf = (folder / "containers.conf").read_text()
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in conf
    assert f'tmp_dir = "{folder}/tmp"' in conf and 'cgroup_manager = "cgroupfs"' in conf
    storage = (folder / "storage.conf").read_text()
    assert f'graphroot = "{folder}/storage"' in storage
    assert f'runroot = "{folder}/run"' in storage

    # a second time: nothing rewritten, PATH not extended again
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}
    again = sourced(tmp_path, f'. "{ENV_SCRIPT}" && echo "$PATH"')
    assert again.strip() == f"{folder}/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert {p: p.stat().st_mtime_ns for p in files} == stamps


def test_podman_keeps_its_store_state_and_caches_under_the_cache(tmp_path: Path) -> None:
    require_tool("podman")
    existed = {p: p.exists() for p in HOST_FOLDERS}
    env = container_env(tmp_path)
    folder = tmp_path / "containers"
    info = json.loads(podman("info", "--format", "json", env=env).stdout)
    assert info["store"]["graphRoot"] == str(folder / "storage")
    assert info["store"]["runRoot"] == str(folder / "run")
    assert info["host"]["ociRuntime"]["path"] == str(folder / "bin" / "runc")

    # an image import copies blobs: containers/image's blob-info cache goes with the wrapper's
    # private /var/lib, not to /var/lib/containers/cache
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = b"fedfaas\n"
        entry = tarfile.TarInfo("hello.txt")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    archive = tmp_path / "layer.tar"
    archive.write_bytes(layer.getvalue())
    podman("import", "--quiet", str(archive), "localhost/fedfaas-env-test:1", env=env)
    assert podman("image", "exists", "localhost/fedfaas-env-test:1", env=env).returncode == 0
    assert list((folder / "storage" / "overlay-images").glob("*/manifest"))
    podman("rmi", "localhost/fedfaas-env-test:1", env=env)
    for path, was in existed.items():
        assert path.exists() == was, f"podman {'removed' if was else 'created'} {path}"
