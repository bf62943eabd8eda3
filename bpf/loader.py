#!/usr/bin/env python3
"""sidecar loader: compile and attach the FedFaaS SK_MSG router (sidecar.c) with bcc.

Loads ``sidecar.c`` as a BPF_PROG_TYPE_SK_MSG program, attaches it as the msg verdict
program of the ``socks`` SOCKHASH, and manages the maps: endpoints are added with their job and
their socket fd, removed on exit, and per-endpoint metrics and drop counters are read back.

USAGE: python -m bpf.loader [-h] [--max-endpoints N] [--count N]
  python -m bpf.loader              # load, route --count frames between two test sockets, print maps
  python -m bpf.loader --ebpf       # print the final C program (with the cflags) and exit

Kernel caveat: needs root (CAP_BPF + CAP_NET_ADMIN), bcc with kernel headers under
/lib/modules/$(uname -r)/build, and Linux >= 5.15 (SK_MSG on SOCKHASH, sk_msg_md->sk and
socket-local storage from SK_MSG). bcc's Python wrapper does not know SOCKHASH (map type 18),
so that map and the socket-storage map are updated through their raw fds.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

from bpf.errors import EbpfUnavailable, RouterError
from bpf.frame import FRAME_SIZE, Kind
from bpf.metrics import EP_METRICS, N_DROP_REASONS, EndpointMetrics, decode_drops, decode_ep_metrics

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("sidecar.c")
MAX_ENDPOINTS = 4096
BPF_ANY, BPF_NOEXIST = 0, 1
SK_MSG_VERDICT = 7  # enum bpf_attach_type BPF_SK_MSG_VERDICT
SINK_ID = 0  # sockhash key of the router's sink socket; endpoint ids start at 1


def cflags(max_endpoints: int = MAX_ENDPOINTS) -> list[str]:
    """The constants the C program is compiled with."""
    return [
        f"-DFRAME_SIZE={FRAME_SIZE}",
        f"-DMAX_ENDPOINTS={max_endpoints}",
        f"-DKIND_UPDATE={int(Kind.UPDATE)}",
        f"-DKIND_PARTIAL={int(Kind.PARTIAL)}",
        f"-DKIND_RESULT={int(Kind.RESULT)}",
        f"-DKIND_GRANT={int(Kind.GRANT)}",
        f"-DN_DROP_REASONS={N_DROP_REASONS}",
        f"-DSINK_ID={SINK_ID}",
    ]


def final_source(max_endpoints: int = MAX_ENDPOINTS) -> str:
    """The C text as compiled: the cflags as #defines, then sidecar.c."""
    defines = "".join(
        "#define {} {}\n".format(*flag[2:].split("=", 1)) for flag in cflags(max_endpoints)
    )
    return defines + SOURCE.read_text()


def missing_headers(release: str | None = None) -> str:
    """Why bcc will not find kernel headers for ``release`` (default: running), or ""."""
    modules = Path(f"/lib/modules/{release or os.uname().release}")
    build = modules / "build"
    if not build.exists():
        return (
            f"no kernel headers at {build}; link /usr/src/linux-headers-*-amd64 there "
            "(scripts/setup.sh does)"
        )
    # Debian splits the headers: bcc needs the arch part (build) and the common part (source).
    if not any((d / "include/linux/kconfig.h").exists() for d in (build, modules / "source")):
        return (
            f"kernel headers at {build} lack include/linux/kconfig.h; link {modules}/source "
            "-> /usr/src/linux-headers-*-common"
        )
    return ""


class _Sender(ct.Structure):
    _fields_ = [("id", ct.c_uint32), ("job", ct.c_uint32)]


class _EpInfo(ct.Structure):
    _fields_ = [("job", ct.c_uint32), ("flags", ct.c_uint32)]


class SidecarProgram:
    """The loaded and attached program with its maps. Not thread-safe: callers serialise.

    Raises
    ------
    EbpfUnavailable
        From :meth:`load` when bcc is missing, not root, or the kernel refuses the program.
    """

    def __init__(self, bpf: Any, fn: Any, lib: Any) -> None:
        self._bpf = bpf
        self._fn = fn
        self._lib = lib
        self._fd_socks = self._map_fd("socks")
        self._fd_senders = self._map_fd("senders")
        self._fd_endpoints = self._map_fd("endpoints")
        self._fd_metrics = self._map_fd("metrics")
        self._fd_drops = self._map_fd("drops")
        self._attached = False
        self._closed = False

    @classmethod
    def load(cls, max_endpoints: int = MAX_ENDPOINTS) -> SidecarProgram:
        """Compile, load and attach the program to its SOCKHASH."""
        if os.geteuid() != 0:
            raise EbpfUnavailable(
                "not root: loading SK_MSG programs needs CAP_BPF and CAP_NET_ADMIN"
            )
        try:
            from bcc import BPF, libbcc
        except ImportError as exc:
            raise EbpfUnavailable(
                f"bcc is not importable ({exc}); install python3-bpfcc and link "
                "/usr/lib/python3/dist-packages/bcc into the virtualenv"
            ) from exc
        missing = missing_headers()
        if missing:
            raise EbpfUnavailable(missing)
        try:
            bpf = BPF(src_file=str(SOURCE).encode(), cflags=cflags(max_endpoints))
            fn = bpf.load_func(b"sidecar_router", BPF.SK_MSG)
        except Exception as exc:  # bcc raises bare Exception for compile and verifier errors
            raise EbpfUnavailable(f"the kernel or bcc refused sidecar.c: {exc}") from exc
        prog = cls(bpf, fn, libbcc.lib)
        try:
            BPF.attach_func(fn, prog._fd_socks, SK_MSG_VERDICT)
        except Exception as exc:
            bpf.cleanup()
            raise EbpfUnavailable(f"cannot attach SK_MSG verdict to the sockhash: {exc}") from exc
        prog._attached = True
        log.info(
            "eBPF sidecar loaded (kernel %s, max %d endpoints)", os.uname().release, max_endpoints
        )
        return prog

    def _map_fd(self, name: str) -> int:
        fd = int(self._lib.bpf_table_fd(self._bpf.module, name.encode()))
        if fd < 0:
            raise EbpfUnavailable(f"map {name} missing from the loaded program")
        return fd

    def _update(self, fd: int, key: Any, value: Any, flags: int, what: str) -> None:
        if self._closed:
            raise RouterError(f"{what}: the sidecar program is unloaded")
        rc = self._lib.bpf_update_elem(fd, ct.byref(key), ct.byref(value), flags)
        if rc < 0:  # libbpf >= 1.0 returns -errno
            raise RouterError(f"{what}: {os.strerror(-rc)} (errno {-rc})")

    def _delete(self, fd: int, key: Any) -> None:
        # ENOENT is expected: the kernel drops a closed socket from the sockhash by itself.
        if self._closed:
            return
        self._lib.bpf_delete_elem(fd, ct.byref(key))

    def add_endpoint(self, endpoint_id: int, job: int, sock_fd: int) -> None:
        """Register ``sock_fd`` (an established TCP socket) as endpoint ``endpoint_id`` of ``job``."""
        key = ct.c_uint32(endpoint_id)
        self._update(self._fd_endpoints, key, _EpInfo(job, 0), BPF_ANY, "endpoints map")
        zero = (ct.c_uint8 * EP_METRICS.size)()
        self._update(self._fd_metrics, key, zero, BPF_ANY, "metrics map")
        try:
            self._update(
                self._fd_senders,
                ct.c_int(sock_fd),
                _Sender(endpoint_id, job),
                BPF_ANY,
                "sender storage",
            )
            self._update(self._fd_socks, key, ct.c_uint32(sock_fd), BPF_NOEXIST, "sockhash")
        except RouterError:
            self.remove_endpoint(endpoint_id)
            raise

    def set_job(self, endpoint_id: int, job: int, sock_fd: int) -> None:
        """Move endpoint ``endpoint_id`` (data socket ``sock_fd``) to ``job`` (a grant)."""
        key = ct.c_uint32(endpoint_id)
        self._update(self._fd_endpoints, key, _EpInfo(job, 0), BPF_ANY, "endpoints map")
        self._update(
            self._fd_senders,
            ct.c_int(sock_fd),
            _Sender(endpoint_id, job),
            BPF_ANY,
            "sender storage",
        )

    def set_sink(self, sock_fd: int) -> None:
        """Install the socket that receives (and the router discards) refused frames."""
        self._update(self._fd_socks, ct.c_uint32(SINK_ID), ct.c_uint32(sock_fd), BPF_ANY, "sink")

    def remove_endpoint(self, endpoint_id: int) -> None:
        """Forget an endpoint: its sockhash entry, its job and its metrics."""
        key = ct.c_uint32(endpoint_id)
        self._delete(self._fd_socks, key)
        self._delete(self._fd_endpoints, key)
        self._delete(self._fd_metrics, key)

    def socket_ids(self) -> set[int]:
        """Keys of the SOCKHASH (the sink, 0, included): the sockets the kernel routes to."""
        # A lookup cannot tell (a sockhash with 4-byte values answers ENOSPC for any key).
        return set(self._keys(self._fd_socks))

    def _keys(self, fd: int) -> list[int]:
        out: list[int] = []
        if self._closed:
            return out
        key, nxt = ct.c_uint32(0), ct.c_uint32(0)
        prev: Any = None
        while self._lib.bpf_get_next_key(fd, prev, ct.byref(nxt)) == 0:
            out.append(nxt.value)
            key.value = nxt.value
            prev = ct.byref(key)
        return out

    def metrics(self) -> dict[int, EndpointMetrics]:
        """Read the whole metrics map (one syscall per entry; no per-message work)."""
        out: dict[int, EndpointMetrics] = {}
        value = (ct.c_uint8 * EP_METRICS.size)()
        for endpoint_id in self._keys(self._fd_metrics):
            key = ct.c_uint32(endpoint_id)
            if self._lib.bpf_lookup_elem(self._fd_metrics, ct.byref(key), value) == 0:
                out[endpoint_id] = decode_ep_metrics(endpoint_id, bytes(value))
        return out

    def drops(self) -> dict[str, int]:
        """Frames refused, by reason."""
        values: list[int] = []
        if self._closed:
            return decode_drops(values)
        v = ct.c_uint64(0)
        for i in range(N_DROP_REASONS):
            k = ct.c_uint32(i)
            values.append(
                v.value
                if self._lib.bpf_lookup_elem(self._fd_drops, ct.byref(k), ct.byref(v)) == 0
                else 0
            )
        return decode_drops(values)

    def close(self) -> None:
        """Detach and unload; sockets still in the map fall back to plain TCP."""
        if self._attached:
            from bcc import BPF

            try:
                BPF.detach_func(self._fn, self._fd_socks, SK_MSG_VERDICT)
            except Exception as exc:
                log.warning("detaching the sidecar: %s", exc)
            self._attached = False
        if not self._closed:
            self._closed = True
            self._bpf.cleanup()


def _self_check(count: int) -> int:
    from bpf.frame import Frame
    from bpf.protocol import loopback_tcp_pair

    prog = SidecarProgram.load()
    pairs = [loopback_tcp_pair() for _ in range(3)]
    try:
        prog.set_sink(pairs[2][0].fileno())
        for endpoint_id, (sock, _peer) in enumerate(pairs[:2], start=1):
            prog.add_endpoint(endpoint_id, 7, sock.fileno())
        a, b = pairs[0][0], pairs[1][0]
        t0 = time.perf_counter()
        for seq in range(count):
            a.sendall(Frame(dst=2, src=1, kind=Kind.UPDATE, job=7, seq=seq).encode())
            b.recv(FRAME_SIZE, 0)
        per = (time.perf_counter() - t0) / count * 1e6
        print(f"{count} frames routed 1 -> 2, {per:.1f} us per send+recv")  # noqa: T201
        for endpoint_id, m in sorted(prog.metrics().items()):
            print(f"endpoint {endpoint_id}: {m}")  # noqa: T201
        print(f"drops: {prog.drops()}")  # noqa: T201
    finally:
        for s1, s2 in pairs:
            s1.close()
            s2.close()
        prog.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bpf.loader", description="Load the FedFaaS SK_MSG sidecar and check it."
    )
    parser.add_argument("--max-endpoints", type=int, default=MAX_ENDPOINTS, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1000, help="frames in the self-check")
    parser.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ebpf:
        print(final_source(args.max_endpoints))  # noqa: T201
        return 0
    try:
        return _self_check(args.count)
    except EbpfUnavailable as exc:
        print(f"eBPF unavailable: {exc.reason}")  # noqa: T201
        return errno.ENOTSUP


if __name__ == "__main__":
    raise SystemExit(main())
