"""A few calls at once on one thread pool the process shares.

For work split in coordinate or byte ranges whose pieces run without the GIL (numpy's folds,
copies and casts): the FedAvg kernels (:mod:`core.fedavg`) and the model's encoding
(:func:`core.wire.encode_view`). Pure plumbing, no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (workers, pool), grown when more are asked


def run_all(calls: Sequence[Callable[[], None]]) -> None:
    """Run ``calls`` at once, the first in the caller's thread and the others on the shared
    pool; return when every one is done (the first error, if any, is raised then)."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    futures = [_executor(len(calls) - 1).submit(call) for call in calls[1:]]
    try:
        calls[0]()
    finally:
        for f in futures:
            f.exception()  # wait for every one before raising anything
    for f in futures:
        f.result()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] < workers:
            old, _pool = _pool, (workers, ThreadPoolExecutor(workers, "fedfaas-parallel"))
            if old is not None:
                old[1].shutdown(wait=False)  # its running calls finish; new ones go to the new pool
        return _pool[1]
