"""Can the eBPF sidecar run here? ``probe()`` answers with the mode and the reason."""

from __future__ import annotations

import os
import re

from bpf.errors import EbpfUnavailable

MIN_KERNEL = (5, 15)


def _kernel_version(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def probe(*, load: bool = True) -> tuple[str, str]:
    """Tell whether the eBPF router can run on this machine.

    Parameters
    ----------
    load : bool
        Also compile, load and attach the program once (about half a second) instead of only
        checking the prerequisites.

    Returns
    -------
    tuple of str
        ``("ebpf", what was checked)`` or ``("userspace", why eBPF is not available)``.
    """
    release = os.uname().release
    if os.geteuid() != 0:
        return "userspace", "not root: loading SK_MSG programs needs CAP_BPF and CAP_NET_ADMIN"
    if _kernel_version(release) < MIN_KERNEL:
        return "userspace", (
            f"kernel {release} is older than {MIN_KERNEL[0]}.{MIN_KERNEL[1]} "
            "(needs sk_msg_md->sk and socket storage from SK_MSG)"
        )
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return "userspace", f"bcc is not importable ({exc}); install python3-bpfcc"
    from bpf.loader import SidecarProgram, missing_headers

    missing = missing_headers(release)
    if missing:
        return "userspace", missing
    if not load:
        return "ebpf", f"root, bcc and headers present on kernel {release} (not loaded)"
    try:
        SidecarProgram.load().close()
    except EbpfUnavailable as exc:
        return "userspace", exc.reason
    return "ebpf", f"SK_MSG sidecar loads and attaches on kernel {release}"
