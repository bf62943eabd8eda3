"""Which router the node uses for sidecar messages: the eBPF one, or the userspace fallback."""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)


def probe() -> tuple[str, str]:
    """Ask the ``bpf`` component whether eBPF redirection works here.

    Returns
    -------
    (mode, reason)
        ``mode`` is ``"ebpf"`` or ``"userspace"``; ``reason`` says why, in words.
    """
    try:
        bpf = importlib.import_module("bpf")
    except Exception as exc:  # any import failure means the component cannot run here
        log.debug("bpf import failed: %s", exc)
        return "userspace", f"bpf component not available ({type(exc).__name__}: {exc})"
    fn = getattr(bpf, "probe", None)
    if not callable(fn):
        return "userspace", "bpf component not available (bpf.probe missing)"
    try:
        result = fn()
        mode, reason = str(result[0]), str(result[1])
    except Exception as exc:  # a failing probe must not break `status`
        log.warning("bpf.probe() failed: %s", exc)
        return "userspace", f"bpf.probe() failed: {type(exc).__name__}: {exc}"
    if mode not in ("ebpf", "userspace"):
        return "userspace", f"bpf.probe() answered an unknown mode {mode!r}: {reason}"
    return mode, reason
