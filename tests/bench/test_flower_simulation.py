"""The network namespace Flower's Simulation Runtime runs in (bench.flower_simulation): Ray's
servers listen on every interface, so the round's processes get a namespace of their own with
loopback alone. A server started in it listens there, not in this process's namespace, and
the namespace has no interface but ``lo``; it goes when stopped. (The round itself runs in
tests/bench/test_secagg.py's tiny run.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.flower_simulation import PrivateNet, actors

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unshare --net needs root")

SERVER = "import http.server as h; h.HTTPServer(('127.0.0.1', 9100), h.BaseHTTPRequestHandler)"
SERVER += ".serve_forever()"


def test_a_server_in_the_namespace_is_on_its_loopback_alone() -> None:
    net = PrivateNet()
    server = subprocess.Popen(net.argv([sys.executable, "-c", SERVER]))
    try:
        deadline = time.monotonic() + 30
        while not net.listening(9100):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        ns = Path(f"/proc/{server.pid}/ns/net")
        assert os.readlink(ns) == os.readlink(f"/proc/{net.holder.pid}/ns/net")
        assert os.readlink(ns) != os.readlink("/proc/self/ns/net")
        lines = Path(f"/proc/{server.pid}/net/dev").read_text().splitlines()[2:]
        assert [line.split(":")[0].strip() for line in lines] == ["lo"]
        # its listening socket is in the namespace's table, not in this one's
        port = f":{9100:04X} "
        assert any(port in row for row in Path(f"/proc/{server.pid}/net/tcp").read_text()
                   .splitlines()[1:] if row.split()[3] == "0A")  # fmt: skip
        assert not net.listening(9101)
    finally:
        server.kill()
        server.wait(10)
        net.stop()
    assert net.holder.poll() is not None


def test_actors_are_told_by_the_title_ray_gives_them() -> None:
    plain = subprocess.Popen(["sleep", "30"])
    actor = subprocess.Popen(["bash", "-c", "exec -a 'ray::ClientAppActor.run' sleep 30"])
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{actor.pid}/cmdline").read_bytes().startswith(b"ray::"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert actors([plain.pid, actor.pid, 999_999_999]) == [actor.pid]
    finally:
        for p in (plain, actor):
            p.kill()
            p.wait(10)
