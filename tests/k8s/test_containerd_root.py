"""containerd's kept root (:mod:`tests.k8s.containerd`) survives what ends a run, on a root of
the test's own (the cache's is left alone). Each case breaks the root as a run can leave it,
then loads the images again on a containerd in a namespace of its own:

- the namespace killed while an import unpacks the echo image (containerd and ctr die with
  it, as when a test times out or a CI job is cancelled): the interrupted import's lease is
  left (evidence it was in flight); the next load deletes it with what only it held and
  imports the image whole, without making the root again;
- the unpacked layer folders of an image gone from disk while containerd's metadata still
  names them (a CI run met metadata naming a snapshot that was gone): the check finds it and
  that image, and only it, is imported again;
- podman's image rebuilt (its id changed): the old image and what only it referenced are
  collected before the new one is imported;
- a root whose metadata database is not one (a torn write): made again from podman's store;
- then the node starts on that root and runs a pod of the image.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.containerd_root import kill_while_unpacking
from tests.containers.conftest import stack_images
from tests.k8s.containerd import STAMPS, Containerd, ContainerdError, podman_images
from tests.k8s.netns import PrivateNamespace
from tests.k8s.node import PAUSE_IMAGE, pod_ready
from tests.k8s.node_files import setup_script
from tests.k8s.node_fixture import require_node, started_node
from tests.openfaas.conftest import wait_for

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ECHO = stack_images(REPO / "stack.yml")["echo"]


@pytest.fixture(scope="module")
def root(k8s_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A containerd root of the module's own, the node's programs and images checked first."""
    require_node([ECHO])
    return tmp_path_factory.mktemp("containerd-root") / "root"


@contextmanager
def containerd_on(root: Path, folder: Path) -> Iterator[Containerd]:
    """containerd alone on ``root``, in a namespace made a node's as the node makes it; the
    namespace (every process in it) killed after."""
    ns = PrivateNamespace(folder / "ns")
    ns.start()
    try:
        sh = ns.wrapper("sh", "/bin/sh")
        subprocess.run([str(sh), "-c", setup_script(folder)], check=True, timeout=60)
        containerd = Containerd(ns, folder, PAUSE_IMAGE, root)
        containerd.start()
        yield containerd
    finally:
        ns.stop()


def test_an_import_killed_half_way_is_finished_by_the_next_load(root: Path, tmp_path: Path) -> None:
    with containerd_on(root, tmp_path / "killed") as containerd:
        containerd.load([PAUSE_IMAGE])
        failure = kill_while_unpacking(containerd, lambda: containerd.load([ECHO]))
        assert failure and isinstance(failure[0], ContainerdError), failure
    assert containerd.rebuilt is None  # a dying run does not delete the root

    with containerd_on(root, tmp_path / "next") as containerd:
        leases = containerd.ctr("leases", "ls", "-q").split()
        assert leases  # the interrupted import's lease: it was in flight
        assert containerd.load([PAUSE_IMAGE, ECHO]) == [ECHO]
        log.info("the killed import left the leases %s; the next load finished it", leases)
        assert containerd.rebuilt is None
        assert containerd.ctr("leases", "ls", "-q").split() == []
        assert "extract-" not in containerd.ctr("snapshots", "ls")  # no half-unpacked layer


def test_an_image_whose_layer_folders_are_gone_is_imported_again(
    root: Path, tmp_path: Path
) -> None:
    (echo,) = podman_images([ECHO])
    with containerd_on(root, tmp_path / "first") as containerd:
        assert containerd.load([PAUSE_IMAGE, ECHO]) == []  # both whole from the test before
        folders = containerd.layer_folders(echo.chain_id)
        assert len(folders) >= 2
    # the bottom layer's files gone behind containerd's back; its metadata still names them
    subprocess.run(["rm", "-rf", folders[-1]], check=True)
    with containerd_on(root, tmp_path / "next") as containerd:
        assert containerd.ctr("snapshots", "info", echo.chain_id)  # metadata: still there
        assert containerd.load([PAUSE_IMAGE, ECHO]) == [ECHO]
        assert containerd.rebuilt is None
        assert all(Path(f).is_dir() for f in containerd.layer_folders(echo.chain_id))


def test_a_rebuilt_image_is_collected_before_its_new_version_is_imported(
    root: Path, tmp_path: Path
) -> None:
    (echo,) = podman_images([ECHO])
    stamp = next((root / STAMPS).glob("*echo*"))
    stamp.write_text("sha256-of-an-older-build")  # as if podman's echo had been rebuilt
    with containerd_on(root, tmp_path / "rebuilt") as containerd:
        old = containerd.layer_folders(echo.chain_id)
        assert containerd.load([PAUSE_IMAGE, ECHO]) == [ECHO]
        assert containerd.rebuilt is None
        new = containerd.layer_folders(echo.chain_id)
    # the old layers were collected (their folders removed) before the import unpacked anew
    assert not set(old) & set(new)
    assert not any(Path(f).exists() for f in old)
    assert stamp.read_text() == echo.id


def test_a_root_whose_metadata_database_is_torn_is_made_again(root: Path, tmp_path: Path) -> None:
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    assert db.is_file()
    db.write_bytes(b"not a bolt database " * 512)
    with containerd_on(root, tmp_path / "torn") as containerd:
        assert containerd.rebuilt is not None  # said why
        assert sorted(containerd.load([PAUSE_IMAGE, ECHO])) == sorted([PAUSE_IMAGE, ECHO])


#: run in a pod of the echo image: python from its bottom layers, the function from its top
_WHOLE = (
    "import pathlib; "
    "assert pathlib.Path('/home/app/index.py').is_file(); "
    "assert pathlib.Path('/home/app/function/handler.py').is_file(); "
    "print('whole', flush=True)"
)


def test_the_node_runs_a_pod_of_the_image_on_that_root(
    k8s_binaries: dict[str, Path], root: Path, tmp_path: Path
) -> None:
    with started_node(k8s_binaries, tmp_path / "node", [ECHO], containerd_root=root) as node:
        assert node.containerd.rebuilt is None
        api = node.cluster.api
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "root-test"}})
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "whole", "namespace": "root-test"},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "whole",
                            "image": ECHO,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-c", _WHOLE],
                        }
                    ],
                },
            }
        )

        def ended() -> bool:
            pod = api.get("v1", "Pod", "whole", "root-test")
            return (pod or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")

        wait_for(ended, "the pod of the echo image ended", 180)
        pod = api.get("v1", "Pod", "whole", "root-test")
        out = node.pod_log("root-test", "whole")
        assert pod is not None and pod["status"]["phase"] == "Succeeded", (pod, out)
        assert "whole" in out
        assert not pod_ready(pod)  # ended, as asked
