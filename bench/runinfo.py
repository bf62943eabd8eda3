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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: the environment variables that size the BLAS and OpenMP pools of a process that has not yet
#: loaded them; :func:`pinned_threads` sets them (for child processes) and limits the pools already
#: loaded in this one
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: thread counts every benchmark process runs with (BLAS and OpenMP pools pinned to one thread,
#: so that processes sharing the cores do not oversubscribe them); the environment a benchmark
#: hands to the processes it starts
PINNED_THREADS = dict.fromkeys(THREAD_ENV, "1")


def thread_counts() -> list[dict[str, Any]]:
    """The thread pools loaded in this process and how many threads each uses now.

    One entry per loaded library, from ``threadpoolctl.threadpool_info()``:
    ``{"api": "blas" | "openmp", "library": "openblas" | "mkl" | ..., "file": basename,
    "threads": n}``. A library not yet loaded is not listed (it will read :data:`THREAD_ENV`).
    """
    from threadpoolctl import threadpool_info

    return [
        {
            "api": p["user_api"],
            "library": p["internal_api"],
            "file": os.path.basename(p["filepath"]),
            "threads": p["num_threads"],
        }
        for p in threadpool_info()
    ]


@contextmanager
def pinned_threads(n: int = 1) -> Iterator[dict[str, Any]]:
    """Run the block with every BLAS/OpenMP pool of this process, and of the processes it starts,
    at ``n`` threads; yield what was measured.

    Inside the block the variables of :data:`THREAD_ENV` are ``n`` (so a child process started in
    it, and a library this process loads later, size their pools to ``n``) and every pool already
    loaded is limited to ``n`` with ``threadpoolctl.threadpool_limits``. numpy and scipy.linalg are
    imported first so that their BLAS libraries are loaded and limited, not just told.

    The yielded dict: ``{"requested": n, "env": {var: value}, "pools": thread_counts()}``, measured
    after pinning. Call :func:`thread_counts` again inside the block to report a row's effective
    counts (a library loaded meanwhile shows up there). On exit the limits and the environment
    are restored.
    """
    if n < 1:
        raise ValueError(f"pinned_threads needs n >= 1, got {n}")
    import numpy  # noqa: F401  (loads numpy's BLAS, so that it is limited below)
    import scipy.linalg  # noqa: F401  (scipy ships its own BLAS)
    from threadpoolctl import threadpool_limits

    saved = {k: os.environ.get(k) for k in THREAD_ENV}
    os.environ.update(dict.fromkeys(THREAD_ENV, str(n)))
    try:
        with threadpool_limits(limits=n):
            yield {
                "requested": n,
                "env": {k: os.environ[k] for k in THREAD_ENV},
                "pools": thread_counts(),
            }
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
