"""The model and the clients of a measured round: the layouts (ResNet-18's, scaled), the
weights written once and shared by every client process, and a client's timed send
(:func:`client_round`: its marks are the window's starts, :mod:`bench.harness.round_window`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness.round_window import status_bytes

#: float32 values of ResNet-18's (10 classes) floating-point state dict: 11,181,642 parameters
#: and 9,600 batch-norm running statistics (102 tensors, 44.8 MB)
RESNET18_VALUES = 11_191_242


def resnet18_layout() -> list[tuple[str, list[int]]]:
    """Names and shapes of torchvision ResNet-18's (10 classes) floating-point state dict."""
    from torchvision.models import resnet18

    sd = resnet18(weights=None, num_classes=10).state_dict()
    return [(k, list(v.shape)) for k, v in sd.items() if v.dtype.is_floating_point]


def scaled_layout(
    base: Sequence[tuple[str, Sequence[int]]], target_bytes: int
) -> list[tuple[str, list[int]]]:
    """``base`` with every tensor's size scaled so the float32 total is ``target_bytes``
    (rounded down to whole values): the same names, count and size distribution, 1-D shapes.
    The base itself (with its shapes) when the target is its size."""
    sizes = [int(_numel(s)) for _, s in base]
    total, target = sum(sizes), target_bytes // 4
    if target == total:
        return [(n, list(s)) for n, s in base]
    if target < len(base):
        raise ValueError(f"{target_bytes} bytes is fewer values than the {len(base)} tensors")
    scaled = [max(1, size * target // total) for size in sizes]
    biggest = max(range(len(scaled)), key=scaled.__getitem__)
    scaled[biggest] += target - sum(scaled)
    return [(n, [k]) for (n, _), k in zip(base, scaled, strict=True)]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layout_bytes(layout: Sequence[tuple[str, Sequence[int]]]) -> int:
    return 4 * sum(_numel(s) for _, s in layout)


def write_weights(path: Any, layout: Sequence[tuple[str, Sequence[int]]], seed: int = 0) -> None:
    """The clients' "trained weights": random float32 values (0.05 x standard normal) for
    ``layout``, back to back in one file (on /dev/shm: every client maps the same pages, so
    N clients do not hold N copies of the model before they serialise it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    left = layout_bytes(layout) // 4
    with open(path, "wb") as f:
        while left:
            n = min(left, 1 << 24)
            f.write((rng.standard_normal(n, dtype=np.float32) * np.float32(0.05)).tobytes())
            left -= n


def share_weights(
    work: Path,
    layout: Sequence[tuple[str, Sequence[int]]],
    *,
    seed: int,
    shared: Path,
    weights: Sequence[Path] | None,
) -> None:
    """Tell a round's client processes (:func:`client_weights`) their weights, in ``work``:
    the layout, and either one file of ``seed`` written to ``shared`` that every client maps
    (``weights is None``) or one file per client (``weights-<k>.path``)."""
    import json

    (work / "layout.json").write_text(json.dumps(layout))
    if weights is None:
        write_weights(shared, layout, seed)
        (work / "weights.path").write_text(str(shared))
    else:
        for k, path in enumerate(weights):
            (work / f"weights-{k}.path").write_text(str(path))


def client_weights(work: Path, cid: int) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Client ``cid``'s layout and weights as :func:`share_weights` told them (its own file,
    else the shared one), mapped by :func:`map_weights`."""
    import json

    layout = [(n, s) for n, s in json.loads((work / "layout.json").read_text())]
    own = work / f"weights-{cid}.path"
    path = (own if own.exists() else work / "weights.path").read_text()
    return layout, map_weights(Path(path), layout)


def wait_go(work: Path, name: object, timeout: float | None = 600.0) -> None:
    """Say this client is ready (``ready-<name>`` in ``work``) and wait for the harness's
    ``go`` file (``RuntimeError`` after ``timeout`` s; None: no limit)."""
    (work / f"ready-{name}").touch()
    deadline = None if timeout is None else time.monotonic() + timeout
    while not (work / "go").exists():
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError(f"client {name}: no go in {timeout}s")
        time.sleep(0.002)


def map_weights(path: Any, layout: Sequence[tuple[str, Sequence[int]]]) -> dict[str, Any]:
    """The weights of :func:`write_weights` as numpy arrays over a copy-on-write map of the
    file, every page touched once (resident before the round starts)."""
    import numpy as np

    flat = np.memmap(path, dtype=np.float32, mode="c")
    out, pos = {}, 0
    for name, shape in layout:
        n = _numel(shape)
        out[name] = flat[pos : pos + n].reshape(shape)
        pos += n
    if pos != flat.size:
        raise ValueError(f"{path}: {flat.size} values, the layout has {pos}")
    float(flat[::1024].sum())  # fault every page in (4 KiB = 1024 values)
    return out


def client_round(
    spec: dict[str, Any],
    out: Path,
    send: Callable[[Any], object],
    *,
    serialise: bool = True,
) -> None:
    """One benchmark client's round, the same for every system measured: map the weights
    (:func:`map_weights`, named in ``spec``), say ready (``ready-<client>`` in the spec's
    ``work`` folder), wait for the ``go`` file, mark ``t_start_ns``, serialise to safetensors
    (``safetensors.numpy.save``), mark ``t_encoded_ns``, ``send`` the bytes, mark
    ``t_done_ns``; write the marks, the process's ``VmHWM`` and its measured thread pools to
    ``out`` as JSON. Without ``serialise``, ``send`` gets the state dict itself (a sender that
    writes the wire format as it sends: FedFaaS's SDK) and ``t_encoded_ns`` is
    ``t_start_ns``: nothing is serialised before the send."""
    import json

    from safetensors.numpy import save

    from bench.runinfo import thread_counts

    work = Path(spec["work"])
    layout = [(n, s) for n, s in json.loads((work / "layout.json").read_text())]
    weights = map_weights(spec["weights"], layout)
    marks: dict[str, Any] = {"cid": spec["client"]}
    wait_go(work, spec["client"], timeout=None)
    marks["t_start_ns"] = time.monotonic_ns()  # weights in memory; nothing serialised
    data: Any = save(weights) if serialise else weights
    marks["t_encoded_ns"] = time.monotonic_ns() if serialise else marks["t_start_ns"]
    send(data)
    marks["t_done_ns"] = time.monotonic_ns()
    marks["client_hwm_bytes"] = status_bytes(os.getpid(), "VmHWM")
    marks["thread_pools"] = thread_counts()
    out.write_text(json.dumps(marks))
