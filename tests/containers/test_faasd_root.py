"""The faasd tier's kept containerd root (:mod:`tests.containers.faasd_root`, on
:mod:`tests.containerd_root` as the k8s tier's) survives what ends a run, on a root of the
test's own (the cache's is left alone). Each case breaks the root as a run can leave it, then
prepares it again on a containerd in a namespace of its own, as :func:`faasd_start.start` does
before scripts/faasd-up.sh runs faasd on it (a compose service's image in ``openfaas``, a
function's in ``openfaas-fn``):

- the namespace killed while an import unpacks the echo image: the interrupted import's lease
  is left (evidence it was in flight); the next preparation deletes it with what only it held
  and imports the image whole, without making the root again;
- the unpacked layer folders of an image gone from disk while containerd's metadata still
  names them: that image, and only it, is imported again;
- podman's image rebuilt (its id changed): the old image and what only it referenced are
  collected before the new one is imported;
- a function's image made whole in a running containerd (the harness's deploy): nothing when
  it is whole, a stale copy deleted, collected and imported again otherwise;
- a root whose metadata database is not one (a torn write): made again from podman's store.

tests/containers/test_faasd_platform.py checks that scripts/faasd-up.sh then imports nothing
on the cache's root (its stamps and these agree).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.containerd_root import ContainerdError, kill_while_unpacking, podman_images
from tests.containers.conftest import image_exists, require_tool, stack_images
from tests.containers.faasd_root import containerd_on, import_running, prepare_root
from tests.openfaas.conftest import under_ci

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ECHO = stack_images(REPO / "stack.yml")["echo"]
#: a compose service's image (deploy/faasd/docker-compose.yaml's redis)
REDIS = "localhost/fedfaas/redis:0.1.0"
WANTED = [("openfaas", REDIS), ("openfaas-fn", ECHO)]
FN = "openfaas-fn"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A containerd root of the module's own, the programs and images checked first (a skip
    saying what is missing; a failure under CI, which must not pass without them)."""
    for tool in ("podman", "containerd", "ctr", "unshare", "nsenter"):
        require_tool(tool)
    unbuilt = [i for _, i in WANTED if not image_exists(i)]
    why = [
        *(["containerd on a root of its own needs root"] if os.geteuid() != 0 else []),
        *(
            [f"images not built: {unbuilt} (make images, deploy/faasd/images.sh)"]
            if unbuilt
            else []
        ),
    ]
    if why and under_ci():
        pytest.fail(f"under CI: {'; '.join(why)}", pytrace=False)
    if why:
        pytest.skip("; ".join(why))
    return tmp_path_factory.mktemp("faasd-containerd-root") / "root"


def test_an_import_killed_half_way_is_finished_by_the_next_preparation(
    root: Path, tmp_path: Path
) -> None:
    with containerd_on(root, tmp_path / "killed") as containerd:
        assert containerd.load_images([WANTED[0]]) == [WANTED[0]]
        failure = kill_while_unpacking(containerd, lambda: containerd.load_images(WANTED))
        assert failure and isinstance(failure[0], ContainerdError), failure
    assert containerd.rebuilt is None  # a dying run does not delete the root

    with containerd_on(root, tmp_path / "look") as containerd:
        leases = containerd.images.ctr(FN, "leases", "ls", "-q").split()
    assert leases  # the interrupted import's lease: it was in flight
    assert prepare_root(root, WANTED, tmp_path / "next") == ([WANTED[1]], None)
    with containerd_on(root, tmp_path / "after") as containerd:
        assert containerd.images.ctr(FN, "leases", "ls", "-q").split() == []
        assert "extract-" not in containerd.images.ctr(FN, "snapshots", "ls")


def test_an_image_whose_layer_folders_are_gone_is_imported_again(
    root: Path, tmp_path: Path
) -> None:
    (echo,) = podman_images([ECHO])
    with containerd_on(root, tmp_path / "first") as containerd:
        assert containerd.load_images(WANTED) == []  # both whole from the test before
        folders = containerd.images.layer_folders(FN, echo.chain_id)
        assert len(folders) >= 2
    # the bottom layer's files gone behind containerd's back; its metadata still names them
    subprocess.run(["rm", "-rf", folders[-1]], check=True)
    assert prepare_root(root, WANTED, tmp_path / "next") == ([WANTED[1]], None)
    with containerd_on(root, tmp_path / "after") as containerd:
        assert all(Path(f).is_dir() for f in containerd.images.layer_folders(FN, echo.chain_id))


def test_a_rebuilt_image_is_collected_before_its_new_version_is_imported(
    root: Path, tmp_path: Path
) -> None:
    (echo,) = podman_images([ECHO])
    with containerd_on(root, tmp_path / "rebuilt") as containerd:
        stamp = containerd.images.stamp(FN, echo)
        stamp.write_text("sha256-of-an-older-build")  # as if podman's echo had been rebuilt
        old = containerd.images.layer_folders(FN, echo.chain_id)
        assert containerd.load_images(WANTED) == [WANTED[1]]
        assert containerd.rebuilt is None
        new = containerd.images.layer_folders(FN, echo.chain_id)
    # the old layers were collected (their folders removed) before the import unpacked anew
    assert not set(old) & set(new)
    assert not any(Path(f).exists() for f in old)
    assert stamp.read_text() == echo.id
    # the name scripts/faasd-up.sh reads: <namespace>--<image, / and : as _>
    assert stamp.name == f"{FN}--" + ECHO.replace("/", "_").replace(":", "_")


def test_a_function_image_is_made_whole_in_a_running_containerd(root: Path, tmp_path: Path) -> None:
    (echo,) = podman_images([ECHO])
    with containerd_on(root, tmp_path / "running") as containerd:
        pid = containerd.ns.pid
        assert import_running(root, pid, FN, ECHO) is False  # whole already
        stamp = containerd.images.stamp(FN, echo)
        stamp.write_text("sha256-of-an-older-build")
        old = containerd.images.layer_folders(FN, echo.chain_id)
        assert import_running(root, pid, FN, ECHO) is True
        assert stamp.read_text() == echo.id
        assert not any(Path(f).exists() for f in old)  # the stale copy collected first
        assert containerd.images.unpacked(FN, echo) is None


def test_a_root_whose_metadata_database_is_torn_is_made_again(root: Path, tmp_path: Path) -> None:
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    assert db.is_file()
    db.write_bytes(b"not a bolt database " * 512)
    imported, rebuilt = prepare_root(root, WANTED, tmp_path / "torn")
    assert rebuilt is not None  # said why
    assert sorted(imported) == sorted(WANTED)
