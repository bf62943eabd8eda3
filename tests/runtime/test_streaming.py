"""Large bodies stream through the runtime: intact both ways, without being held in its memory."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator

import psutil
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import FN_AUTH, available, client, echo_body

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _chunks(total_mib: int, digest: hashlib._Hash) -> Iterator[bytes]:
    block = bytearray(os.urandom(MiB))
    for i in range(total_mib):
        block[:8] = i.to_bytes(8, "little")
        chunk = bytes(block)
        digest.update(chunk)
        yield chunk


class _PeakRss:
    """Samples a process's RSS in a thread and keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> _PeakRss:
        self.peak = self.proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def big_echo(runtime: RuntimeProcess) -> str:
    with client(runtime) as http:
        assert http.post("/system/functions", json=echo_body("big-echo")).status_code == 202
        wait_until(lambda: available(http, "big-echo") == 1)
        # warm the proxy path so one-off allocations are not counted as growth
        assert http.post("/function/big-echo", content=b"x" * MiB).status_code == 200
    return "big-echo"


def _roundtrip(
    runtime: RuntimeProcess, fn: str, mib: int, *, chunked: bool
) -> tuple[str, str, int, int]:
    sent = hashlib.sha256()
    got = hashlib.sha256()
    headers = {"Content-Type": "application/octet-stream", **FN_AUTH}
    if not chunked:
        headers["Content-Length"] = str(mib * MiB)
    assert runtime.pid is not None
    with (
        client(runtime, timeout=300) as http,
        _PeakRss(runtime.pid) as rss,
    ):
        before = rss.peak
        with http.stream(
            "POST", f"/function/{fn}", content=_chunks(mib, sent), headers=headers
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/octet-stream"
            size = 0
            for chunk in r.iter_raw():
                got.update(chunk)
                size += len(chunk)
    assert size == mib * MiB
    return sent.hexdigest(), got.hexdigest(), before, rss.peak


def test_200_mib_body_comes_back_byte_identical_without_growing_the_runtime(
    runtime: RuntimeProcess, big_echo: str
) -> None:
    mib = 200
    sent, got, before, peak = _roundtrip(runtime, big_echo, mib, chunked=False)
    assert got == sent
    assert peak - before < mib * MiB // 2, f"runtime RSS grew by {(peak - before) / MiB:.0f} MiB"


def test_chunked_request_body_streams_through_intact(
    runtime: RuntimeProcess, big_echo: str
) -> None:
    sent, got, _, _ = _roundtrip(runtime, big_echo, 24, chunked=True)
    assert got == sent
