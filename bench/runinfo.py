"""What a benchmark's JSON says about its run, and how its files are written.

- ``run_info("bench.dataplane", argv)``, called as the run starts, is stored under the result's
  ``run`` key: commit (sha, dirty), start time (and, once written, end time) in UTC, the machine,
  the exact command, the thread pools. Two result files can then be told apart and compared (the
  figures drift with the machine; the ratios within one run hold).
- :func:`write_result` writes ``<name>.json`` and renders ``<name>.md`` FROM that JSON as written
  (read back), so the Markdown can never say something the JSON does not.
- :func:`pinned_threads` runs a block with every BLAS/OpenMP pool at ``n`` threads, for real
  (``threadpoolctl``), and reports the counts; :func:`thread_counts` reports them per row.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
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
    "threads": n}``. A library not yet loaded is not listed.
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


def max_pool_threads() -> int | None:
    """The most threads any loaded BLAS/OpenMP pool uses now (``None`` when none is loaded): the
    one figure a result row records as its thread count."""
    counts = [p["threads"] for p in thread_counts()]
    return max(counts) if counts else None


@contextmanager
def pinned_threads(n: int = 1) -> Iterator[dict[str, Any]]:
    """Run the block with every BLAS/OpenMP pool of this process, and of the processes it starts,
    at ``n`` threads; yield what was measured.

    Inside the block the variables of :data:`THREAD_ENV` are ``n`` (so a child process started in
    it sizes its pools to ``n``) and every pool already loaded in this process is limited to ``n``
    with ``threadpoolctl.threadpool_limits``. numpy and scipy.linalg are imported first so that
    their BLAS libraries are loaded and limited, not just told.

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


def stop_on_sigterm() -> None:
    """A SIGTERM (``timeout``, a CI job cancelled) exits through ``SystemExit``, so that the
    ``finally`` blocks run: the benchmark's servers, clients, cgroups and shared-memory files
    are taken down, not left behind (Python's default SIGTERM ends the process without them).

    Once it has fired, further SIGTERMs are ignored: a second one (``pkill -f`` matches both
    ``timeout`` and the benchmark under it, and ``timeout`` forwards its own) would raise again
    inside the teardown the first one started and leave the platform running (seen: a
    ``bench.faults`` run left its whole platform on the default ports). SIGKILL still ends a
    teardown that hangs.

    A process that handles SIGTERM already keeps its own handler: the test suite, which runs
    benchmarks' ``main`` in its process, stops the whole run on SIGTERM (a ``SystemExit`` in
    a test would fail that test and let the run go on)."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_once)


def _exit_once(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown runs to its end
    sys.exit(143)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def commit() -> dict[str, Any]:
    """``{"sha": HEAD or None, "dirty": uncommitted changes in the tree}``; the results folder
    does not count (``make bench`` rewrites it as it goes, so every benchmark after the first
    would say dirty)."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def run_info(module: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The ``run`` block of a result, taken as the run starts.

    Keys: ``commit`` (:func:`commit`), ``started`` (UTC ISO; ``time`` is the same value, kept for
    older readers), ``finished`` (``None`` until :func:`write_result` stamps it), ``machine``
    (:func:`machine`), ``command`` (``python -m module args``, as it would be typed again),
    ``argv`` (the interpreter's exact command line, ``sys.orig_argv``), ``cwd``, and ``threads``:
    the thread variables of :data:`THREAD_ENV` as set now and :func:`thread_counts` (call it
    inside :func:`pinned_threads` to record the pinned counts).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    started = _now()
    return {
        "commit": commit(),
        "started": started,
        "time": started,
        "finished": None,
        "machine": machine(),
        "command": shlex.join(["python", "-m", module, *args]),
        "argv": list(sys.orig_argv),
        "cwd": os.getcwd(),
        "threads": {
            "env": {k: os.environ.get(k) for k in THREAD_ENV},
            "pools": thread_counts(),
        },
    }


def write_result(
    result: dict[str, Any], name: str, render: Callable[[dict[str, Any]], str], out_dir: Path
) -> tuple[dict[str, Any], str]:
    """Write ``out_dir/<name>.json`` and ``out_dir/<name>.md``; return (JSON as read back, md).

    Stamps ``result["run"]["finished"]`` (UTC ISO) when the result has a ``run`` block, writes
    the JSON, reads it back and renders the Markdown with ``render`` from what was read: every
    figure in the .md is one of the .json. :func:`rerender` re-renders a stored result.
    """
    if isinstance(result.get("run"), dict):
        result["run"]["finished"] = _now()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    stored = json.loads(path.read_text())
    md = render(stored)
    (out_dir / f"{name}.md").write_text(md)
    return stored, md


def rerender(
    name: str,
    render: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
    out_dir: Path,
) -> str:
    """Rewrite ``out_dir/<name>.md`` and ``<name>.png`` from ``<name>.json`` as it is (its
    finished time included; a benchmark's ``--from-json``); return the Markdown."""
    stored = json.loads((out_dir / f"{name}.json").read_text())
    md = render(stored)
    (out_dir / f"{name}.md").write_text(md)
    plot(stored, out_dir / f"{name}.png")
    return md


def run_header(run: dict[str, Any]) -> str:
    """One Markdown paragraph on the run: command, times, commit, machine, thread pools."""
    c, m, th = run.get("commit") or {}, run.get("machine") or {}, run.get("threads") or {}
    sha = (c.get("sha") or "unknown")[:12] + (" (dirty tree)" if c.get("dirty") else "")
    pools = th.get("pools") or []
    counts = ", ".join(f"{p['library']} {p['threads']}" for p in pools) or "none loaded"
    env = ", ".join(f"{k}={v}" for k, v in (th.get("env") or {}).items())
    return (
        f"Run: `{run.get('command')}`, started {run.get('started') or run.get('time')}, "
        f"finished {run.get('finished')}; commit {sha}. Machine: {m.get('cores')} cores "
        f"({m.get('usable_cores')} usable), {m.get('cpu')}, {m.get('memory_gib')} GiB, kernel "
        f"{m.get('kernel')}, Python {m.get('python')}. Thread pools at start: {counts} ({env})."
    )
