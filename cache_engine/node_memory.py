"""One memory budget per node, shared by its node gateway and its cache engine.

One setting, ``node_memory_bytes`` (``FEDFAAS_NODE_MEMORY_BYTES``, ``--node-memory-bytes``),
read by both: the bytes of the node's memory FedFaaS may hold in its object store and in
FLStore. Unset, it is :data:`DEFAULT_FRACTION` of the node's memory (:func:`node_memory`: the
cgroup's limit where that is lower). Both sides count the same store the same way
(:func:`store_bytes`): the pages the node gateways' shared-memory stores hold, as the memory
file system itself counts them (a file's allocated blocks), so the numbers never drift from
the memory actually taken and cost a ``stat`` per store file to read. The store comes first:
the gateway refuses uploads only when its store would pass the budget; FLStore uses what the
store leaves (:mod:`cache_engine.budget`) and gives it back when the store grows into it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

#: the share of the node's memory FedFaaS uses when ``node_memory_bytes`` is unset
DEFAULT_FRACTION = 0.5
#: the environment variable both the node gateway and the cache engine read
NODE_MEMORY_VAR = "FEDFAAS_NODE_MEMORY_BYTES"
#: the share of the budget up to which a round's root keeps its updates in the store for
#: FLStore (the handoff); past it they leave once aggregated, as without a handoff, so the
#: rest stays for the round's own uploads (FLStore reads those updates from MinIO)
LEND_SHARE = 0.5


def node_memory(
    meminfo: Path = Path("/proc/meminfo"),
    cgroup: Path = Path("/sys/fs/cgroup/memory.max"),
) -> int:
    """Bytes of memory this node gives this process: ``MemTotal``, or the cgroup's limit where
    that is lower."""
    total = 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            break
    try:
        raw = cgroup.read_text().strip()
    except OSError:
        raw = "max"
    if raw.isdigit() and 0 < int(raw) < total:
        return int(raw)
    return total


def node_budget(setting: int | None, *, memory: int | None = None) -> int:
    """The node's budget: ``setting`` where given, else :data:`DEFAULT_FRACTION` of ``memory``
    (default :func:`node_memory`)."""
    if setting:
        return int(setting)
    return int((_this_node() if memory is None else memory) * DEFAULT_FRACTION)


@functools.cache
def _this_node() -> int:
    """:func:`node_memory`, read once (a node's memory does not change while it runs)."""
    return node_memory()


def past_budget(
    root: str | Path, setting: int | None, nbytes: int, share: float = 1.0
) -> str | None:
    """Why ``nbytes`` more would take the stores under ``root`` past ``share`` of the node's
    budget (``setting``, see :func:`node_budget`); None where they fit."""
    limit = int(node_budget(setting) * share)
    held = store_bytes(root)
    if held + nbytes <= limit:
        return None
    part = "" if share == 1.0 else f"{share:g} of "
    return (
        f"the node's object stores hold {held} bytes, and {nbytes} more would pass "
        f"{part}its memory budget ({limit} bytes; node_memory_bytes)"
    )


def store_bytes(root: str | Path | None) -> int:
    """Bytes of memory the object stores under ``root`` hold now (0 without one).

    ``root`` is the node gateways' store root (``<root>/<node>/<job>/...``): every node folder
    under it is counted, so two gateways sharing one machine (``fedfaas up``'s node0 and node1)
    count against one budget. A file's memory is its allocated blocks on the memory file
    system: an arena's pre-faulted and live slots, not the holes punched into freed ones;
    plain-file objects alike. A folder that goes while it is read counts as empty.
    """
    if root is None:
        return 0
    return _blocks(Path(root), depth=3)


def _blocks(path: Path, depth: int) -> int:
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:  # gone meanwhile, or not there yet
        return 0
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if depth > 1:
                    total += _blocks(Path(e.path), depth - 1)
            elif e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_blocks * 512
        except OSError:  # freed meanwhile
            continue
    return total
