"""The faasd tier's containerd root, kept in the cache from run to run, made crash-safe as the
k8s tier's (:mod:`tests.containerd_root`).

Before ``scripts/faasd-up.sh`` runs faasd on the root, :func:`prepare_root` starts containerd
alone on it, in a namespace of its own (``/run`` private: containerd's state and socket), and
loads every image the run needs into its namespace (``openfaas`` for compose services,
``openfaas-fn`` for functions): an earlier run's containers, every lease and the stale images
deleted, one synchronous collection, then the stale and missing images imported and checked
whole, the root made again once where that still fails. It writes the stamps the script reads
(``fedfaas-imported/<namespace>--<image>``: podman's image id), so the script finds every image
whole and imports none. :func:`import_running` imports a function's image into a running
faasd's containerd the same way (a stale copy deleted and collected first, then checked whole).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.containerd_root import ContainerdOnRoot, KeptRoot, podman_images
from tests.k8s.netns import PrivateNamespace

#: containerd's socket, as faasd expects it (``scripts/faasd-up.sh`` puts it there too)
SOCKET = "/run/containerd/containerd.sock"


class FaasdContainerd(ContainerdOnRoot):
    """containerd without its CRI plugin (as ``scripts/faasd-up.sh`` runs it), on ``root``."""

    def __init__(self, ns: PrivateNamespace, folder: Path, root: Path) -> None:
        super().__init__(ns, folder, root, stamp_namespace=True)

    def config(self) -> str:
        return (
            "version = 2\n"
            f"root = {json.dumps(str(self.root))}\n"
            'state = "/run/containerd"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            "[grpc]\n"
            f"  address = {json.dumps(SOCKET)}\n"
        )


@contextmanager
def containerd_on(root: Path, folder: Path) -> Iterator[FaasdContainerd]:
    """containerd on ``root`` in a new namespace whose ``/run`` is a tmpfs of its own; the
    namespace (containerd with it) stopped after."""
    ns = PrivateNamespace(folder / "ns")
    ns.start()
    try:
        sh = ns.wrapper("sh", "/bin/sh")
        subprocess.run(
            [str(sh), "-c", "mount -t tmpfs -o mode=0755 tmpfs /run"], check=True, timeout=60
        )
        containerd = FaasdContainerd(ns, folder, root)
        containerd.start()
        yield containerd
    finally:
        ns.stop()


def prepare_root(
    root: Path, wanted: Sequence[tuple[str, str]], folder: Path
) -> tuple[list[tuple[str, str]], str | None]:
    """Make every ``(namespace, image)`` of ``wanted`` whole on ``root`` (see the module);
    returns the pairs imported and why the root was made again (None: it was not).

    Raises
    ------
    tests.containerd_root.ContainerdError
        containerd did not start, or an image could not be made whole even on a new root.
    """
    with containerd_on(root, folder) as containerd:
        return containerd.load_images(wanted), containerd.rebuilt


def import_running(root: Path, pid: int, namespace: str, ref: str) -> bool:
    """Make ``ref`` whole in the containerd of the running faasd whose namespace's PID 1 is
    ``pid`` (its root ``root``): nothing when its stamp and its layers say it is; else its
    stale copy deleted and collected, then imported and checked whole. Whether it imported."""
    images = KeptRoot(
        root, ["nsenter", f"--target={pid}", "--net", "--mount", "ctr"], stamp_namespace=True
    )
    (image,) = podman_images([ref])
    present = set(images.ctr(namespace, "images", "ls", "-q").split())
    if images.whole(namespace, image, present):
        return False
    if image.ref in present:
        images.ctr(namespace, "images", "rm", image.ref)
        images.collect(namespace)
    images.import_whole(namespace, image)
    return True
