"""A containerd root kept from run to run, made crash-safe: the k8s tier's node
(:mod:`tests.k8s.containerd`) and the faasd tier (:mod:`tests.containers.faasd_root`) keep
theirs in the cache so that an image podman has not changed is imported once.

A kept root has to survive what ends a run: a namespace killed half-way through an import (a
test's timeout, a cancelled CI job), and containerd 1.6's garbage collector, which can delete an
unreferenced layer snapshot between an import's check that the snapshot exists and its use as
the next layer's parent (containerd issues 3787 and 10723, fixed in 1.6.37; Debian has 1.6.20).
A CI run met the second after images were rebuilt: ``failed to prepare extraction snapshot
...: parent snapshot sha256:... does not exist: not found``. So :meth:`KeptRoot.load`, before
it imports anything:

1. deletes the containers of an earlier run, every lease (an interrupted import holds one),
   and every image that is stale: podman's image changed, or containerd's copy is not whole
   (its name, and the CRI plugin's reference by image id that no name shares any more), in
   every containerd namespace it loads images into;
2. runs one synchronous garbage collection, which removes what nothing references any more;
3. only then imports the stale and missing images: no image is replaced while another is
   unpacked, and every snapshot an import finds is referenced by an image, so the collector
   takes none from under it;
4. and checks each image whole: a read-only view of its top layer snapshot (its chain ID, from
   podman's diff IDs) opens, and every layer folder the view mounts is on disk.

A root that still fails (containerd does not answer on it, an import or a check fails) is
deleted and made again from podman's store, once (:class:`ContainerdOnRoot`);
:attr:`ContainerdOnRoot.rebuilt` says why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.services.process import stop_group
from tests.containers.conftest import container_env
from tests.k8s.netns import PrivateNamespace
from tests.openfaas.conftest import wait_for

log = logging.getLogger(__name__)

#: podman's image id of each image imported whole, one file per image, in the root
STAMPS = "fedfaas-imported"
#: the lease whose synchronous deletion runs containerd's garbage collection
COLLECT_LEASE = "fedfaas-collect"
#: the overlay snapshotter's folder in a root
OVERLAYFS = "io.containerd.snapshotter.v1.overlayfs"


class ContainerdError(RuntimeError):
    """containerd did not start, or an image could not be imported whole (the message says
    which and why)."""


def chain_id(diff_ids: list[str]) -> str:
    """The chain ID of a stack of layers (OCI image spec, "Layer ChainID"): the key of the
    snapshot containerd unpacks the top layer into."""
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


@dataclass(frozen=True)
class PodmanImage:
    """An image of podman's store: its reference, id and top layer's chain ID."""

    ref: str
    id: str
    chain_id: str


def podman_images(refs: Sequence[str]) -> list[PodmanImage]:
    """Each of ``refs`` as podman's store (FedFaaS's, :func:`container_env`) holds it."""
    env = container_env()
    found = []
    for ref in refs:
        res = subprocess.run(
            ["podman", "image", "inspect", ref],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise ContainerdError(f"image {ref} is not in podman's store (run `make images`)")
        (info,) = json.loads(res.stdout)
        found.append(PodmanImage(ref, info["Id"], chain_id(info["RootFS"]["Layers"])))
    return found


def tool(name: str) -> str:
    """The path of program ``name`` (ContainerdError naming it when it is not installed)."""
    found = shutil.which(name)
    if found is None:
        raise ContainerdError(f"{name} is not installed (scripts/setup.sh installs it)")
    return found


class KeptRoot:
    """The images of containerd's ``root``, made whole through ``ctr``.

    Parameters
    ----------
    root
        containerd's root (its stamps folder, :data:`STAMPS`, lives in it).
    ctr
        The command that runs ``ctr`` against that containerd (in its namespace), before
        ``-n NAMESPACE``.
    stamp_namespace
        Whether a stamp's name starts with ``<namespace>--`` (the faasd tier's, two namespaces
        and ``scripts/faasd-up.sh``'s names) or is the reference alone (the k8s tier's).
    """

    def __init__(self, root: Path, ctr: Sequence[str], *, stamp_namespace: bool = False) -> None:
        self.root, self.ctr_command, self.stamp_namespace = root, list(ctr), stamp_namespace

    def run(
        self,
        namespace: str,
        args: list[str],
        *,
        check: bool = True,
        timeout: float = 120,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """``ctr -n NAMESPACE ARGS``; ContainerdError on a failure when ``check``."""
        res = subprocess.run(
            [*self.ctr_command, "-n", namespace, *args],
            capture_output=True, text=True, timeout=timeout, check=False, **kw,
        )  # fmt: skip
        if check and res.returncode != 0:
            raise ContainerdError(f"ctr -n {namespace} {' '.join(args[:3])}: {res.stderr.strip()}")
        return res

    def ctr(self, namespace: str, *args: str) -> str:
        """``ctr -n NAMESPACE ARGS``'s output (ContainerdError on failure)."""
        return self.run(namespace, list(args)).stdout

    def load(self, wanted: Sequence[tuple[str, PodmanImage]]) -> list[tuple[str, str]]:
        """Make each ``(namespace, image)`` whole, cleaning the root first (see the module);
        the ``(namespace, reference)`` pairs imported (the others were whole already)."""
        stamps = self.root / STAMPS
        stamps.mkdir(exist_ok=True)
        namespaces = sorted({ns for ns, _ in wanted})
        for ns in namespaces:
            old = self.ctr(ns, "containers", "ls", "-q").split()
            if old:  # an earlier run's (their tasks died with its namespace)
                self.ctr(ns, "containers", "rm", *old)
            for lease in self.ctr(ns, "leases", "ls", "-q").split():
                self.ctr(ns, "leases", "rm", lease)
        present = {ns: set(self.ctr(ns, "images", "ls", "-q").split()) for ns in namespaces}
        stale = [(ns, i) for ns, i in wanted if not self.whole(ns, i, present[ns])]
        for ns, image in stale:
            self.stamp(ns, image).unlink(missing_ok=True)
            if image.ref in present[ns]:
                self.ctr(ns, "images", "rm", image.ref)
        for ns in namespaces:
            orphans = self._orphan_ids(ns)
            if orphans:
                self.ctr(ns, "images", "rm", *orphans)
        if namespaces:
            self.collect(namespaces[0])
        for ns, image in stale:
            self.import_whole(ns, image)
        return [(ns, i.ref) for ns, i in stale]

    def collect(self, namespace: str) -> None:
        """containerd's garbage collection (of the whole root), now, returning when it is done
        (a lease deleted with ``--sync``)."""
        self.ctr(namespace, "leases", "create", "--id", COLLECT_LEASE)
        self.ctr(namespace, "leases", "rm", "--sync", COLLECT_LEASE)

    def _orphan_ids(self, namespace: str) -> list[str]:
        """The CRI plugin's image-id references (``sha256:<config digest>``, which it adds
        beside each image's name) whose image no name references any more: while one stays,
        the collector keeps the old image's layers."""
        targets: dict[str, str] = {}
        for line in self.ctr(namespace, "images", "ls").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3:
                targets[fields[0]] = fields[2]
        named = {d for ref, d in targets.items() if not ref.startswith("sha256:")}
        return [r for r, d in targets.items() if r.startswith("sha256:") and d not in named]

    def stamp(self, namespace: str, image: PodmanImage) -> Path:
        """The file holding podman's id of ``image`` once imported whole into ``namespace``."""
        name = image.ref.replace("/", "_").replace(":", "_")
        return self.root / STAMPS / (f"{namespace}--{name}" if self.stamp_namespace else name)

    def whole(self, namespace: str, image: PodmanImage, present: set[str]) -> bool:
        """Whether ``image`` is whole in ``namespace``: named there (``present``: the names
        there), stamped with podman's id of it, its layers unpacked on disk."""
        stamp = self.stamp(namespace, image)
        if image.ref not in present or not stamp.exists() or stamp.read_text() != image.id:
            return False
        problem = self.unpacked(namespace, image)
        if problem:
            log.warning("%s in containerd's root: %s; importing it again", image.ref, problem)
        return problem is None

    def unpacked(self, namespace: str, image: PodmanImage) -> str | None:
        """None where the image's top layer snapshot opens as a read-only view whose layer
        folders are all on disk; what is wrong otherwise."""
        try:
            folders = self.layer_folders(namespace, image.chain_id)
        except ContainerdError as exc:
            return f"its layers' snapshot {image.chain_id} does not open: {exc}"
        missing = [f for f in folders if not Path(f).is_dir()]
        if not folders or missing:
            return f"layer folders missing from disk: {missing or 'all'}"
        return None

    def layer_folders(self, namespace: str, chain_id: str) -> list[str]:
        """The folders of the layers under snapshot ``chain_id``, top first (those a read-only
        view of it mounts)."""
        view = f"fedfaas-check-{uuid.uuid4().hex}"
        out = self.ctr(namespace, "snapshots", "view", "--mounts", view, chain_id)
        # no lease holds the view: the collector may have taken it already
        self.run(namespace, ["snapshots", "rm", view], check=False)
        return layer_folders(json.loads(out))

    def import_whole(self, namespace: str, image: PodmanImage) -> None:
        """Import ``image`` from podman's store, check it whole and stamp it (ContainerdError
        saying what failed). Safe on a root :meth:`load` has cleaned: nothing unreferenced is
        left there for the collector to take from under the import."""
        log.info("importing %s into containerd's %s namespace", image.ref, namespace)
        save = subprocess.Popen(
            ["podman", "save", "--format", "oci-archive", image.ref],
            env=container_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert save.stdout is not None
        try:
            self.run(
                namespace, ["images", "import", "--all-platforms", "-"],
                stdin=save.stdout, timeout=900,
            )  # fmt: skip
        finally:
            save.stdout.close()
            save.wait(120)
        if save.returncode != 0:
            raise ContainerdError(f"podman save {image.ref}: exit {save.returncode}")
        problem = self.unpacked(namespace, image)
        if problem:
            raise ContainerdError(f"{image.ref} imported, yet {problem}")
        stamp = self.stamp(namespace, image)
        stamp.parent.mkdir(exist_ok=True)
        part = stamp.parent / f"{stamp.name}.part"
        part.write_text(image.id)
        os.replace(part, stamp)


def layer_folders(mounts: list[dict[str, Any]]) -> list[str]:
    """The layer folders of a view's mounts (``ctr snapshots view --mounts``: ``Type``,
    ``Source``, ``Options``): an overlay's ``lowerdir``s, top first, or a bind mount's source
    (a one-layer image)."""
    folders = []
    for mount in mounts:
        if mount.get("Type") == "bind":
            folders.append(mount["Source"])
        for option in mount.get("Options") or []:
            if option.startswith("lowerdir="):
                folders.extend(option.removeprefix("lowerdir=").split(":"))
    return folders


class ContainerdOnRoot:
    """containerd in ``ns`` on a kept ``root``; subclasses give its configuration.

    Parameters
    ----------
    ns
        The started namespace (``/run`` private to it: containerd's state and socket).
    folder
        containerd's configuration and log.
    root
        containerd's root, kept from run to run (tests give their own).
    log_path
        containerd's log (default: in ``folder``).
    """

    def __init__(
        self,
        ns: PrivateNamespace,
        folder: Path,
        root: Path,
        log_path: Path | None = None,
        *,
        stamp_namespace: bool = False,
    ) -> None:
        self.ns, self.folder, self.root = ns, folder, root
        self.log_path = log_path or folder / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: why the root was deleted and made again, if it was
        self.rebuilt: str | None = None
        self.stamp_namespace = stamp_namespace

    @property
    def images(self) -> KeptRoot:
        """The root's images, through ``ctr`` in the namespace (its wrapper names the
        namespace's pid: made at each use, as a node makes this object before its namespace
        starts)."""
        ctr = str(self.ns.wrapper("ctr", tool("ctr")))
        return KeptRoot(self.root, [ctr], stamp_namespace=self.stamp_namespace)

    def config(self) -> str:
        """containerd's configuration file's text (files it names are written here)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ process
    def start(self, timeout: float = 120.0) -> subprocess.Popen[bytes]:
        """Start containerd on the root; returns once it answers on its socket. A root it
        does not start on is made again."""
        try:
            return self._start(timeout)
        except ContainerdError as exc:
            self._rebuild(exc)
            return self._start(timeout)

    def _start(self, timeout: float) -> subprocess.Popen[bytes]:
        self.root.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "containerd.toml"
        config.write_text(self.config())
        self.proc = self.ns.spawn(
            ["containerd", f"--config={config}"], self.log_path, cwd=self.folder
        )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ContainerdError(
                    f"containerd exited with code {self.proc.returncode}: {self.log_tail()}"
                )
            if self.images.run("default", ["version"], check=False).returncode != 0:
                return False  # not listening yet
            self.images.ctr("default", "images", "ls", "-q")  # its metadata database opened
            return True

        try:
            wait_for(answers, "containerd answering on its socket", timeout)
        except AssertionError as exc:
            raise ContainerdError(f"{exc}: {self.log_tail()}") from None
        return self.proc

    def stop(self) -> None:
        """Stop containerd (its namespace lives on)."""
        if self.proc is not None:
            stop_group(self.proc, 20)
            self.proc = None

    def log_tail(self, chars: int = 2000) -> str:
        """The end of containerd's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _rebuild(self, failure: ContainerdError, *, answering: bool = False) -> None:
        """Delete the root (containerd stopped) after ``failure``, unless the namespace is
        going (or, with ``answering``, containerd no longer answers): then the run is ending,
        not the root failing, and the root is kept."""
        if not self.ns.alive() or (answering and not self._answers()):
            raise failure
        log.warning(
            "containerd's root %s: %s; making it again from podman's store", self.root, failure
        )
        self.rebuilt = str(failure)
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _answers(self) -> bool:
        """containerd runs and answers (a namespace being killed fails this)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            res = self.images.run("default", ["version"], check=False, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return False
        return res.returncode == 0

    # ------------------------------------------------------------------ images
    def load_images(self, wanted: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Make each ``(namespace, reference)`` (podman's image) whole in containerd; the
        pairs imported (the others were whole already). The root is made again where that
        fails on it."""
        refs = [r for _, r in wanted]
        images = dict(zip(refs, podman_images(refs), strict=True))
        pairs = [(ns, images[r]) for ns, r in wanted]
        try:
            return self.images.load(pairs)
        except ContainerdError as exc:
            self._rebuild(exc, answering=True)
            self._start(120.0)
            return self.images.load(pairs)


# ---------------------------------------------------------------------- for the root's tests
def snapshot_folders(root: Path) -> set[str]:
    """The overlay snapshotter's snapshot folders in ``root``."""
    folder = root / OVERLAYFS / "snapshots"
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def kill_while_unpacking(
    containerd: ContainerdOnRoot, load: Callable[[], object], timeout: float = 300
) -> list[BaseException]:
    """Run ``load`` (an import into ``containerd``) on a thread and kill containerd's
    namespace once two more layer snapshots are on disk: the first layer done, the import
    not (as when a run's timeout or a cancelled CI job ends it). What ``load`` raised."""
    before = snapshot_folders(containerd.root)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            load()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failure.append(exc)

    loading = threading.Thread(target=run)
    loading.start()
    try:
        grown = lambda: len(snapshot_folders(containerd.root) - before) >= 2  # noqa: E731
        wait_for(grown, "the image's layers unpacking", timeout)
        assert loading.is_alive()
    finally:
        containerd.ns.stop()  # the run ends: containerd and ctr killed
        loading.join(120)
    return failure
