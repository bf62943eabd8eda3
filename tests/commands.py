"""The repository's command lines (``python -m MODULE ...``) as the tests run them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_module(
    module: str, *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` in the repository and wait for it, its output as text.

    Parameters
    ----------
    module, args
        The command line after ``python -m``.
    timeout
        Seconds it may take (``subprocess.TimeoutExpired`` past them).
    env
        Its whole environment (default: this process's).
    """
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=None if env is None else dict(env),
    )
