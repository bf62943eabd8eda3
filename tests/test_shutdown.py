"""core.shutdown.serve: a FastAPI service whose stop hangs still exits, after its grace or at
a second SIGTERM, with exit 1 and a log of what it abandoned; a clean stop exits 0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from core.services import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]

SERVICE = """
import sys, time
from fastapi import FastAPI
from core.shutdown import serve

app = FastAPI()

@app.get("/stuck")
def stuck() -> dict:  # a worker thread no cancel reaches: the interpreter would wait for it
    open(sys.argv[3], "w").close()  # the test's sign that the call is in the handler
    time.sleep(600)
    return {}

@app.get("/healthz")
def healthz() -> dict:
    return {"ok": True}

sys.exit(serve(app, host="127.0.0.1", port=int(sys.argv[1]), grace=float(sys.argv[2])))
"""


def _start(grace: float, entered: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(port), str(grace), str(entered)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_port("127.0.0.1", port, 30)
    return p, port


def _stop(p: subprocess.Popen[str], signals: int, within: float) -> tuple[float, str]:
    t0 = time.monotonic()
    for _ in range(signals):
        p.send_signal(signal.SIGTERM)
        time.sleep(0.5)
    try:
        _, err = p.communicate(timeout=within)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return time.monotonic() - t0, err


def test_a_clean_stop_exits_0(tmp_path: Path) -> None:
    p, port = _start(grace=20, entered=tmp_path / "entered")
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    took, err = _stop(p, 1, within=20)
    assert p.returncode == 0, err
    assert "stop not finished" not in err


@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_that_hangs_ends_after_the_grace_or_a_second_signal(
    signals: int, tmp_path: Path
) -> None:
    grace = 4.0 if signals == 1 else 60.0
    entered = tmp_path / "entered"
    p, port = _start(grace, entered)

    def call() -> None:  # ends when the stopped service drops the connection
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/stuck", timeout=grace + 30)

    threading.Thread(target=call, daemon=True).start()
    deadline = time.monotonic() + 30  # the call is in the handler, in a worker thread
    while not entered.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert entered.exists(), "the call never reached the stuck handler"
    took, err = _stop(p, signals, within=grace + 15)
    assert p.returncode == 1, err
    assert took < (10 if signals == 2 else grace + 10), took
    why = "a second signal" if signals == 2 else f"{grace:g}s grace"
    assert f"stop not finished after {why}" in err, err
    assert "in stuck" in err, err  # the abandoned thread's stack names the stuck handler


def test_a_child_that_segfaults_leaves_its_python_traceback_in_its_log(tmp_path: Path) -> None:
    """Every child FedFaaS starts runs with the fault handler on: a crash in a C extension
    (the runtime once died of one without a word) names where it happened."""
    from core.services import spawn

    log = tmp_path / "child.log"
    code = "import ctypes\ndef boom():\n    ctypes.string_at(0)\nboom()\n"
    proc = spawn([sys.executable, "-c", code], log_path=log)
    assert proc.wait(30) == -11  # SIGSEGV
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text and "in boom" in text, text
