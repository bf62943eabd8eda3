"""containerd for a test node (:mod:`tests.k8s.node`), with its CRI plugin, on a root kept from
run to run so that an image podman has not changed is imported once. The root is made
crash-safe as :mod:`tests.containerd_root` says (shared with the faasd tier): before importing,
the node deletes an earlier run's containers, every lease and the stale images with their
orphaned CRI image-id references, collects synchronously, then imports and checks each image
whole, making the root again once when it still fails.
"""

from __future__ import annotations

from pathlib import Path

from core.services import CACHE_DIR
from tests.containerd_root import (
    STAMPS,
    ContainerdError,
    ContainerdOnRoot,
    PodmanImage,
    chain_id,
    layer_folders,
    podman_images,
)
from tests.k8s.netns import PrivateNamespace
from tests.k8s.node_files import cni_network, containerd_config

__all__ = [
    "CONTAINERD_ROOT",
    "CRI_NAMESPACE",
    "STAMPS",
    "Containerd",
    "ContainerdError",
    "PodmanImage",
    "chain_id",
    "layer_folders",
    "podman_images",
]

#: containerd's root, kept from run to run: an image podman has not changed is imported once
CONTAINERD_ROOT = CACHE_DIR / "k8s" / "containerd"
#: ctr's namespace for the CRI plugin's images
CRI_NAMESPACE = "k8s.io"


class Containerd(ContainerdOnRoot):
    """containerd in ``ns`` (made a node by :func:`tests.k8s.node_files.setup_script`), the
    parameters :class:`~tests.containerd_root.ContainerdOnRoot`'s (``folder`` also holds the
    CNI network) and ``pause_image``, the pod sandbox image (the CRI plugin's
    ``sandbox_image``); ``root`` the cache's by default."""

    def __init__(
        self,
        ns: PrivateNamespace,
        folder: Path,
        pause_image: str,
        root: Path = CONTAINERD_ROOT,
        log_path: Path | None = None,
    ) -> None:
        super().__init__(ns, folder, root, log_path)
        self.pause_image = pause_image

    def config(self) -> str:
        cni = self.folder / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-fedfaas.conflist").write_text(cni_network(self.folder / "cni-ipam"))
        return containerd_config(self.root, cni, self.pause_image)

    def ctr(self, *args: str) -> str:
        """``ctr -n k8s.io ARGS`` in the namespace; its output (ContainerdError on failure)."""
        return self.images.ctr(CRI_NAMESPACE, *args)

    def load(self, refs: list[str]) -> list[str]:
        """Make each image of ``refs`` (podman's) whole in containerd's ``k8s.io`` namespace;
        the references imported (the others were whole already). The root is made again
        where that fails on it."""
        return [ref for _, ref in self.load_images([(CRI_NAMESPACE, r) for r in refs])]

    def collect(self) -> None:
        """containerd's garbage collection, now, returning when it is done."""
        self.images.collect(CRI_NAMESPACE)

    def layer_folders(self, chain_id: str) -> list[str]:
        """The folders of the layers under snapshot ``chain_id`` in ``k8s.io``, top first."""
        return self.images.layer_folders(CRI_NAMESPACE, chain_id)
