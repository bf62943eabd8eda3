"""containerd for a test node (:mod:`tests.k8s.node`), with its CRI plugin, on a root kept from
run to run so that an image podman has not changed is imported once.

A kept root has to survive what ends a run: a namespace killed half-way through an import (a
test's timeout, a cancelled CI job), and containerd 1.6's garbage collector, which can delete an
unreferenced layer snapshot between an import's check that the snapshot exists and its use as
the next layer's parent (containerd issues 3787 and 10723, fixed in 1.6.37; Debian has 1.6.20).
A CI run met the second after images were rebuilt: ``failed to prepare extraction snapshot
...: parent snapshot sha256:... does not exist: not found``. So :meth:`Containerd.load`, before
it imports anything:

1. deletes the containers of an earlier run, every lease (an interrupted import holds one),
   and every image that is stale: podman's image changed, or containerd's copy is not whole
   (its name, and the CRI plugin's reference by image id that no name shares any more);
2. runs one synchronous garbage collection, which removes what nothing references any more;
3. only then imports the stale and missing images: no image is replaced while another is
   unpacked, and every snapshot an import finds is referenced by an image, so the collector
   takes none from under it;
4. and checks each image whole: a read-only view of its top layer snapshot (its chain ID, from
   podman's diff IDs) opens, and every layer folder the view mounts is on disk.

A root that still fails (containerd does not answer on it, an import or a check fails) is
deleted and made again from podman's store, once; :attr:`Containerd.rebuilt` says why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.services import CACHE_DIR
from core.services.process import stop_group
from tests.containers.conftest import container_env
from tests.k8s.netns import PrivateNamespace
from tests.k8s.node_files import cni_network, containerd_config
from tests.openfaas.conftest import wait_for

log = logging.getLogger(__name__)

#: containerd's root, kept from run to run: an image podman has not changed is imported once
CONTAINERD_ROOT = CACHE_DIR / "k8s" / "containerd"
#: podman's image id of each image imported whole, one file per image, in the root
STAMPS = "fedfaas-imported"
#: the lease whose synchronous deletion runs containerd's garbage collection
COLLECT_LEASE = "fedfaas-collect"
#: ctr's namespace for the CRI plugin's images
CRI_NAMESPACE = "k8s.io"


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


def podman_images(refs: list[str]) -> list[PodmanImage]:
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


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ContainerdError(f"{name} is not installed (scripts/setup.sh installs it)")
    return found


class Containerd:
    """containerd in ``ns`` (made a node by :func:`tests.k8s.node_files.setup_script`).

    Parameters
    ----------
    ns
        The started namespace.
    folder
        The node's folder: containerd's configuration, the CNI network and its log.
    pause_image
        The pod sandbox image (the CRI plugin's ``sandbox_image``).
    root
        containerd's root, kept from run to run (tests give their own).
    log_path
        containerd's log (default: in ``folder``).
    """

    def __init__(
        self,
        ns: PrivateNamespace,
        folder: Path,
        pause_image: str,
        root: Path = CONTAINERD_ROOT,
        log_path: Path | None = None,
    ) -> None:
        self.ns, self.folder, self.pause_image, self.root = ns, folder, pause_image, root
        self.log_path = log_path or folder / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: why the root was deleted and made again, if it was
        self.rebuilt: str | None = None

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
        cni = self.folder / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-fedfaas.conflist").write_text(cni_network(self.folder / "cni-ipam"))
        config = self.folder / "containerd.toml"
        config.write_text(containerd_config(self.root, cni, self.pause_image))
        self.proc = self.ns.spawn(
            ["containerd", f"--config={config}"], self.log_path, cwd=self.folder
        )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ContainerdError(
                    f"containerd exited with code {self.proc.returncode}: {self.log_tail()}"
                )
            if self._run(["version"], check=False).returncode != 0:
                return False  # not listening yet
            self.ctr("images", "ls", "-q")  # its metadata database opened
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
            return self._run(["version"], check=False, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    # ------------------------------------------------------------------ ctr
    def _run(
        self, args: list[str], *, check: bool = True, timeout: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        ctr = self.ns.wrapper("ctr", _tool("ctr"))
        res = subprocess.run(
            [str(ctr), "-n", CRI_NAMESPACE, *args],
            capture_output=True, text=True, timeout=timeout, check=False, **kw,
        )  # fmt: skip
        if check and res.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args[:3])}: {res.stderr.strip()}")
        return res

    def ctr(self, *args: str) -> str:
        """``ctr -n k8s.io ARGS`` in the namespace; its output (ContainerdError on failure)."""
        return self._run(list(args)).stdout

    # ------------------------------------------------------------------ images
    def load(self, refs: list[str]) -> list[str]:
        """Make each image of ``refs`` (podman's) whole in containerd's ``k8s.io`` namespace;
        the references imported (the others were whole already). The root is made again
        where that fails on it."""
        images = podman_images(refs)
        try:
            return self._load(images)
        except ContainerdError as exc:
            self._rebuild(exc, answering=True)
            self._start(120.0)
            return self._load(images)

    def _load(self, images: list[PodmanImage]) -> list[str]:
        stamps = self.root / STAMPS
        stamps.mkdir(exist_ok=True)
        old = self.ctr("containers", "ls", "-q").split()
        if old:  # an earlier run's (their tasks died with its namespace): kubelet starts from none
            self.ctr("containers", "rm", *old)
        for lease in self.ctr("leases", "ls", "-q").split():
            self.ctr("leases", "rm", lease)
        present = set(self.ctr("images", "ls", "-q").split())
        stale = [i for i in images if not self._whole(i, present)]
        for image in stale:
            _stamp(stamps, image).unlink(missing_ok=True)
            if image.ref in present:
                self.ctr("images", "rm", image.ref)
        orphans = self._orphan_ids()
        if orphans:
            self.ctr("images", "rm", *orphans)
        self.collect()
        for image in stale:
            self._import(image)
            problem = self._unpacked(image)
            if problem:
                raise ContainerdError(f"{image.ref} imported, yet {problem}")
            _write_stamp(stamps, image)
        return [i.ref for i in stale]

    def collect(self) -> None:
        """containerd's garbage collection, now, returning when it is done (a lease deleted
        with ``--sync``)."""
        self.ctr("leases", "create", "--id", COLLECT_LEASE)
        self.ctr("leases", "rm", "--sync", COLLECT_LEASE)

    def _orphan_ids(self) -> list[str]:
        """The CRI plugin's image-id references (``sha256:<config digest>``, which it adds
        beside each image's name) whose image no name references any more: while one stays,
        the collector keeps the old image's layers."""
        targets: dict[str, str] = {}
        for line in self.ctr("images", "ls").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3:
                targets[fields[0]] = fields[2]
        named = {d for ref, d in targets.items() if not ref.startswith("sha256:")}
        return [r for r, d in targets.items() if r.startswith("sha256:") and d not in named]

    def _whole(self, image: PodmanImage, present: set[str]) -> bool:
        stamp = _stamp(self.root / STAMPS, image)
        if image.ref not in present or not stamp.exists() or stamp.read_text() != image.id:
            return False
        problem = self._unpacked(image)
        if problem:
            log.warning("%s in containerd's root: %s; importing it again", image.ref, problem)
        return problem is None

    def _unpacked(self, image: PodmanImage) -> str | None:
        """None where the image's top layer snapshot opens as a read-only view whose layer
        folders are all on disk; what is wrong otherwise."""
        try:
            folders = self.layer_folders(image.chain_id)
        except ContainerdError as exc:
            return f"its layers' snapshot {image.chain_id} does not open: {exc}"
        missing = [f for f in folders if not Path(f).is_dir()]
        if not folders or missing:
            return f"layer folders missing from disk: {missing or 'all'}"
        return None

    def layer_folders(self, chain_id: str) -> list[str]:
        """The folders of the layers under snapshot ``chain_id``, top first (those a read-only
        view of it mounts)."""
        view = f"fedfaas-check-{uuid.uuid4().hex}"
        out = self.ctr("snapshots", "view", "--mounts", view, chain_id)
        # no lease holds the view: the collector may have taken it already
        self._run(["snapshots", "rm", view], check=False)
        return layer_folders(json.loads(out))

    def _import(self, image: PodmanImage) -> None:
        log.info("importing %s into containerd's %s namespace", image.ref, CRI_NAMESPACE)
        save = subprocess.Popen(
            ["podman", "save", "--format", "oci-archive", image.ref],
            env=container_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert save.stdout is not None
        try:
            self._run(["images", "import", "--all-platforms", "-"], stdin=save.stdout, timeout=900)
        finally:
            save.stdout.close()
            save.wait(120)
        if save.returncode != 0:
            raise ContainerdError(f"podman save {image.ref}: exit {save.returncode}")


def _stamp(stamps: Path, image: PodmanImage) -> Path:
    return stamps / image.ref.replace("/", "_").replace(":", "_")


def _write_stamp(stamps: Path, image: PodmanImage) -> None:
    stamp = _stamp(stamps, image)
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
