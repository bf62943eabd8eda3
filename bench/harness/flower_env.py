"""Flower's own Python environment for the benchmarks, made once and cached.

Flower 1.42 pins its web stack (``fastapi<0.139``, ``starlette<1.4``, ``uvicorn<0.50``) below the
versions the platform's services run on, so the newest Flower cannot share the project's
environment. The benchmarks run Flower, the peer system, from a virtual environment of its own
under ``~/.cache/fedfaas/flower-<version>``: :func:`flower_python` makes it on first use (the
interpreter running this code, ``pip install flwr==<version>`` with numpy, psutil and
threadpoolctl for the benchmark's marks, httpx and safetensors for the light client package),
under a file lock, and returns its interpreter; later calls return it at once. This
repository is put on ``PYTHONPATH`` of the processes that run in it. ``simulation=True`` is
another environment beside it, ``~/.cache/fedfaas/flower-<version>-simulation``, with
``flwr[simulation]`` (Flower's Simulation Runtime and the Ray it pins), kept apart so that the
Deployment Runtime's benchmarks run without Ray installed.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: the newest Flower the package registry serves here; its Message API and Deployment Runtime
FLOWER_VERSION = "1.42.0"
#: what Flower's processes import besides Flower: the benchmark's marks and the client package
EXTRAS = ("numpy>=1.26", "psutil>=5.9", "threadpoolctl>=3", "httpx>=0.27", "safetensors>=0.4")
CACHE = Path(os.environ.get("FEDFAAS_CACHE", Path.home() / ".cache" / "fedfaas"))


class FlowerEnvError(RuntimeError):
    """Flower's environment could not be made (the pip output says why)."""


def flower_home(version: str = FLOWER_VERSION, *, simulation: bool = False) -> Path:
    """The folder of Flower ``version``'s environment (``venv/`` in it once made); with
    ``simulation``, the one with its Simulation Runtime."""
    return CACHE / (f"flower-{version}-simulation" if simulation else f"flower-{version}")


def flower_python(
    version: str = FLOWER_VERSION, timeout: float = 900.0, *, simulation: bool = False
) -> Path:
    """The interpreter of Flower ``version``'s environment (``simulation``: the one with
    ``flwr[simulation]``), made first if it is not there (idempotent; concurrent callers wait
    for the one making it). Raises :class:`FlowerEnvError` with pip's output when the install
    fails."""
    home = flower_home(version, simulation=simulation)
    python = home / "venv" / "bin" / "python"
    done = home / "venv.done"
    if done.exists():
        return python
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return python
        shutil.rmtree(home / "venv", ignore_errors=True)  # a half-made one from a failed try
        log.info("making Flower %s's environment under %s", version, home)
        steps = [
            [sys.executable, "-m", "venv", str(home / "venv")],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             f"flwr[simulation]=={version}" if simulation else f"flwr=={version}", *EXTRAS],
        ]  # fmt: skip
        for argv in steps:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise FlowerEnvError(
                    f"{' '.join(argv[:4])} exited {res.returncode}: {res.stderr[-2000:]}"
                )
        done.touch()
    return python


def flower_bin(name: str, version: str = FLOWER_VERSION) -> Path:
    """A command of Flower ``version``'s environment (``flower-superlink``, ``flwr``, ...)."""
    return flower_python(version).parent / name
