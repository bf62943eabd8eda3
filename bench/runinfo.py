"""What a benchmark's JSON says about its run: the commit, the time, the machine, the command.

``run_info("bench.dataplane", argv)`` is stored under the result's ``run`` key, so that two result
files can be told apart and compared (the figures drift with the machine; the ratios within one
run hold).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: thread counts every benchmark process runs with (BLAS and OpenMP pools pinned to one thread,
#: so that processes sharing the cores do not oversubscribe them)
PINNED_THREADS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def commit() -> dict[str, Any]:
    """``{"sha": HEAD or None, "dirty": uncommitted changes in the tree}``."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"sha": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def machine() -> dict[str, Any]:
    """Cores (all, and usable by this process), memory, CPU model, kernel, Python."""
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
                break
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": model or platform.processor(),
        "memory_bytes": mem,
        "memory_gib": round(mem / 2**30, 1),
        "kernel": os.uname().release,
        "python": platform.python_version(),
    }


def run_info(module: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The ``run`` block of a result: commit, UTC time, machine, command, pinned threads."""
    args = sys.argv[1:] if argv is None else argv
    return {
        "commit": commit(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": shlex.join(["python", "-m", module, *args]),
        "threads": dict(PINNED_THREADS),
    }
