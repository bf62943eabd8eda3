"""A started test node for a module's fixture (:mod:`tests.k8s.node`): what it needs checked
first (skipped where missing, failed under CI, each named), stopped after with a check that the
host keeps nothing of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.containers.conftest import image_exists
from tests.k8s.cluster import Cluster, binary, k8s_dir
from tests.k8s.conftest import _missing
from tests.k8s.containerd import CONTAINERD_ROOT
from tests.k8s.node import COREDNS_IMAGE, NODE_BINARIES, PAUSE_IMAGE, Node, missing_tools
from tests.k8s.node_files import KERNEL_DEFAULTS


def _kernel_settings() -> dict[str, str]:
    return {key: Path(f"/proc/sys/{key}").read_text() for key in KERNEL_DEFAULTS}


def require_node(images: list[str], tools: tuple[str, ...] = ()) -> dict[str, Path]:
    """The node's programs (name -> path), once each of them, the host tools and ``images``
    (with the pause and CoreDNS images) is found; skipped where one is missing, failed under
    CI, each named. ``tools`` are more missing programs the caller found."""
    missing = [n for n in NODE_BINARIES if binary(n) is None]
    if missing:
        _missing(f"{', '.join(missing)} missing from {k8s_dir()}: run `make k8s-binaries`")
    absent = [*missing_tools(), *tools]
    if absent:
        _missing(f"not installed: {', '.join(absent)} (scripts/setup.sh installs them)")
    unbuilt = [i for i in (PAUSE_IMAGE, COREDNS_IMAGE, *images) if not image_exists(i)]
    if unbuilt:
        _missing(f"not in podman's store: {', '.join(unbuilt)} (`make test-k8s` builds them)")
    return {n: p for n in NODE_BINARIES if (p := binary(n)) is not None}


@contextmanager
def started_node(
    k8s_binaries: dict[str, Path],
    folder: Path,
    images: list[str],
    tools: tuple[str, ...] = (),
    containerd_root: Path = CONTAINERD_ROOT,
) -> Iterator[Node]:
    """A cluster with every controller and its node (``images`` imported), in ``folder``.

    ``tools`` are more missing programs the caller found (named with the node's);
    ``containerd_root`` is the cache's unless a test gives its own. After the block: every
    process ended, kubelet's cgroups removed, the host's kernel settings unchanged.
    """
    binaries = {**k8s_binaries, **require_node(images, tools)}
    kernel = _kernel_settings()
    cluster = Cluster(folder, binaries, controllers="*")
    node = Node(cluster, binaries, containerd_root)
    try:
        cluster.start()
        node.start(images)
        yield node
    finally:
        procs = list(cluster.procs.values())
        node.stop()
    assert all(p.poll() is not None for p in procs), "a process outlived the namespace"
    assert not node.cgroups_left(), "kubelet's cgroups were left in the host's tree"
    assert _kernel_settings() == kernel, "a kernel setting of the host changed"
