"""Draw FedFaaS's architecture picture (docs/architecture.svg) from this file.

    python scripts/architecture_diagram.py [OUT]     # make docs-diagram

The picture is data: :data:`BOXES` (the parts, where they sit) and :data:`ARROWS` (who talks to
whom, over what). The SVG is written reproducibly (no date and no creator version, a fixed id
salt, text kept as text) and names this file's SHA-256 (:func:`source_digest`) in its
description, so ``tests/docs/test_architecture_diagram.py`` can hold the committed picture to
this source whatever matplotlib release draws it.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.svg"

#: colours by role: who trains, the FL data path, FLStore, control, storage, the provider
COLOURS = {
    "user": "#f2f2f2",
    "data": "#d6e9f8",
    "flstore": "#e3f1dc",
    "control": "#fbe5c8",
    "store": "#ebe1f5",
    "faas": "#fde2e2",
}


@dataclass(frozen=True)
class Box:
    """One part: its label (first line bold), its folder, its role and its place (x, y, w, h)."""

    key: str
    label: str
    folder: str
    role: str
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Arrow:
    """A call from one part to another, with what it carries."""

    src: str
    dst: str
    label: str
    both: bool = False


#: columns and rows of the grid the boxes sit on
_COL = (0.2, 4.2, 8.2, 12.2)
_ROW = (0.3, 2.2, 4.2, 6.4)

BOXES = (
    Box("clients", "FL clients", "client/ (SDK, Flower)", "user", _COL[0], _ROW[3], 3.3, 1.0),
    Box("control", "control plane", "control_plane/", "control", _COL[1], _ROW[3], 3.3, 1.0),
    Box(
        "analyst",
        "analyst, job owner",
        "Job.query, POST /v1/queries",
        "user",
        _COL[3],
        _ROW[3],
        3.3,
        1.0,
    ),
    Box("gw0", "node gateway (root)", "gateway/: shm arena", "data", _COL[0], _ROW[2], 3.3, 1.0),
    Box("gw1", "node gateway", "gateway/: shm arena", "data", _COL[1], _ROW[2], 3.3, 1.0),
    Box("engine", "cache engine", "cache_engine/", "flstore", _COL[3], _ROW[2], 3.3, 1.0),
    Box("tracker", "request tracker", "request_tracker/", "flstore", _COL[2], _ROW[2], 3.3, 1.0),
    Box("agg", "aggregator replicas", "functions/aggregator/", "data", _COL[0], _ROW[1], 3.3, 1.0),
    Box("redis", "Redis", "journal, job state, table", "store", _COL[1], _ROW[1], 3.3, 1.0),
    Box("cache", "flstore-cache-N", "functions/flstore/", "flstore", _COL[2], _ROW[1], 3.3, 1.0),
    Box(
        "eval", "evaluator function", "functions/evaluator/", "flstore", _COL[3], _ROW[1], 3.3, 1.0
    ),
    Box("bpf", "eBPF sidecar", "bpf/: SK_MSG redirect", "data", _COL[0], _ROW[0], 3.3, 1.0),
    Box("minio", "MinIO", "checkpoints, cold copies", "store", _COL[1], _ROW[0], 3.3, 1.0),
    Box(
        "workloads",
        "FLStore workloads",
        "flstore_workloads/",
        "flstore",
        _COL[2],
        _ROW[0],
        3.3,
        1.0,
    ),
    Box(
        "runtime",
        "OpenFaaS provider",
        "runtime/, faasd, faas-netes",
        "faas",
        _COL[3],
        _ROW[0],
        3.3,
        1.0,
    ),
)

ARROWS = (
    Arrow("clients", "control", "enroll, assignment"),
    Arrow("clients", "gw0", "upload updates"),
    Arrow("control", "gw0", "plans"),
    Arrow("control", "gw1", "rounds"),
    Arrow("control", "tracker", "selection, flags"),
    Arrow("gw1", "gw0", "partials"),
    Arrow("gw0", "agg", "grants, frames", both=True),
    Arrow("agg", "bpf", "64-byte frames", both=True),
    Arrow("gw1", "redis", "journal"),
    Arrow("gw0", "minio", "checkpoints"),
    Arrow("analyst", "tracker", "queries"),
    Arrow("tracker", "engine", "plans"),
    Arrow("engine", "cache", "load rounds"),
    Arrow("tracker", "cache", "workload"),
    Arrow("cache", "eval", "sub-models"),
    Arrow("cache", "workloads", "runs"),
    Arrow("cache", "minio", "cold reads"),
)


def _centre(b: Box) -> tuple[float, float]:
    return b.x + b.w / 2, b.y + b.h / 2


def _edge(b: Box, towards: tuple[float, float]) -> tuple[float, float]:
    """Where the line from ``b``'s centre to ``towards`` leaves ``b`` (arrows start at edges)."""
    cx, cy = _centre(b)
    dx, dy = towards[0] - cx, towards[1] - cy
    scale = min(
        (b.w / 2 + 0.05) / abs(dx) if dx else float("inf"),
        (b.h / 2 + 0.05) / abs(dy) if dy else float("inf"),
    )
    return cx + dx * scale, cy + dy * scale


def draw(out: Path) -> Path:
    """Render the picture to ``out`` (SVG; byte-for-byte the same on every run)."""
    plt.rcParams.update({"svg.hashsalt": "fedfaas-architecture", "svg.fonttype": "none"})
    fig, ax = plt.subplots(figsize=(15.7, 8))
    ax.set_xlim(0, 15.7)
    ax.set_ylim(0, 8)
    ax.axis("off")
    boxes = {b.key: b for b in BOXES}
    for b in BOXES:
        ax.add_patch(
            FancyBboxPatch(
                (b.x, b.y),
                b.w,
                b.h,
                boxstyle="round,pad=0.02,rounding_size=0.12",
                fc=COLOURS[b.role],
                ec="#555555",
            )
        )
        cx, cy = _centre(b)
        ax.text(cx, cy + 0.15, b.label, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(cx, cy - 0.2, b.folder, ha="center", va="center", fontsize=8, family="monospace")
    for a in ARROWS:
        src, dst = boxes[a.src], boxes[a.dst]
        (x0, y0), (x1, y1) = _edge(src, _centre(dst)), _edge(dst, _centre(src))
        ax.add_patch(
            FancyArrowPatch(
                (x0, y0),
                (x1, y1),
                arrowstyle="<|-|>" if a.both else "-|>",
                mutation_scale=12,
                color="#333333",
                lw=1.0,
                shrinkA=0,
                shrinkB=0,
            )
        )
        # a horizontal arrow's label sits above it, any other's on it
        lift = 0.18 if y0 == y1 else 0.0
        ax.text(
            (x0 + x1) / 2,
            (y0 + y1) / 2 + lift,
            a.label,
            ha="center",
            va="center",
            fontsize=7.5,
            style="italic",
            bbox={"fc": "white", "ec": "none", "pad": 0.5},
        )
    ax.set_title("FedFaaS: the FL data path (left), FLStore (right), on an OpenFaaS provider")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"Date": None, "Creator": None, "Description": f"source sha256 {source_digest()}"}
    fig.savefig(out, format="svg", metadata=meta, bbox_inches="tight")
    plt.close(fig)
    return out


def source_digest() -> str:
    """SHA-256 of this file: the picture's description names the source it was drawn from."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Write the picture to the path given (default: docs/architecture.svg)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_OUT
    print(f"architecture picture: {draw(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
