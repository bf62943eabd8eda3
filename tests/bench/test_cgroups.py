"""bench.harness.cgroups on the real cgroup v1 hierarchies of this machine (root): a child's
memory, CPU time, shared-memory pages and threads land in its group, the group pins its CPUs,
and it is removed afterwards, its processes killed or moved back first."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import cgroups
from bench.harness.cgroups import Cgroup, CgroupError, Window, parse_cpus

MiB = 1 << 20
_names = itertools.count()

pytestmark = pytest.mark.skipif(
    cgroups.unavailable() is not None, reason=str(cgroups.unavailable())
)


def _name() -> str:
    return f"fedfaas-test-{os.getpid()}-{next(_names)}"


@pytest.fixture
def group() -> Iterator[Cgroup]:
    g = Cgroup(_name())
    try:
        yield g
    finally:
        g.close()
    assert not any(p.exists() for p in g.dirs.values())


def _python(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args])


def test_cpu_lists_parse_and_bad_ones_say_what_is_wrong() -> None:
    assert parse_cpus("0") == [0]
    assert parse_cpus("0-1") == [0, 1]
    assert parse_cpus(" 3,0-1,1 ") == [0, 1, 3]
    for bad, why in [("", "empty"), ("a", "not a CPU"), ("2-1", "backwards"), ("0-", "not a")]:
        with pytest.raises(ValueError, match=why):
            parse_cpus(bad)


def test_a_child_that_allocates_n_mib_peaks_at_least_n_mib(group: Cgroup) -> None:
    with group.spawning():
        p = _python(
            """
            import sys
            buf = bytearray(int(sys.argv[1]) << 20)  # zeroed: every page touched
            buf[::4096] = b"x" * len(buf[::4096])
            """,
            "96",
        )
    assert p.wait(60) == 0
    assert group.peak_bytes() >= 96 * MiB
    # the harness thread went back to its own groups
    assert cgroups.own_paths()["memory"] != str(group.dirs["memory"])


def test_a_busy_second_is_counted_as_cpu_time_and_the_group_is_removed_after() -> None:
    g = Cgroup(_name())
    with g:
        window = Window(g).start()
        with g.spawning():
            p = _python(
                """
                import time
                end = time.process_time() + 1.0
                while time.process_time() < end:
                    pass
                """
            )
        assert p.wait(60) == 0
        figures = window.stop()
    assert figures["cpu_s"] > 0.5
    assert not any(path.exists() for path in g.dirs.values())


def test_shared_memory_is_charged_once_to_the_group_that_touched_it_first(tmp_path: Path) -> None:
    shm = Path(f"/dev/shm/fedfaas-test-cg-{os.getpid()}")
    writer, reader = Cgroup(_name()), Cgroup(_name())
    try:
        with writer, reader:
            with writer.spawning():
                p = _python(
                    "import sys; open(sys.argv[1], 'wb').write(b'y' * (64 << 20))", str(shm)
                )
            assert p.wait(60) == 0
            # the writer has exited: its file's pages stay charged to its group
            assert writer.memory_bytes() >= 64 * MiB
            reader.reset_peak()
            with reader.spawning():
                p = _python(
                    """
                    import mmap, sys
                    with open(sys.argv[1], "rb") as f:
                        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                        assert sum(m[i] for i in range(0, len(m), 4096)) == ord("y") * 16384
                    """,
                    str(shm),
                )
            assert p.wait(60) == 0
            assert reader.peak_bytes() < 32 * MiB  # mapped and read, not charged again
            shm.unlink()
            assert writer.memory_bytes() < 16 * MiB  # freed with the file
    finally:
        shm.unlink(missing_ok=True)


def test_children_forked_later_are_in_the_group_and_pinned_to_its_cpus(tmp_path: Path) -> None:
    with Cgroup(_name(), cpus="0") as g:
        assert g.cpus == "0"
        out = tmp_path / "affinity"
        with g.spawning():
            p = _python(
                """
                import os, subprocess, sys
                code = "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
                subprocess.run([sys.executable, "-c", code, sys.argv[1]], check=True)
                """,
                str(out),
            )
        assert p.wait(60) == 0
        assert out.read_text() == "[0]"
        with g.spawning():
            p = _python("import subprocess, sys; subprocess.Popen(['sleep', '600']); sys.exit(0)")
        assert p.wait(60) == 0
        (grandchild,) = g.pids()  # the sleep, orphaned: still in the group
        g.close()
        assert not Path(f"/proc/{grandchild}/status").exists() or "Z" in _state(grandchild)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except OSError:
        return "Z"


def test_close_may_move_the_processes_back_instead_of_killing_them() -> None:
    g = Cgroup(_name())
    p = subprocess.Popen(["sleep", "600"])
    try:
        g.add(p.pid)
        assert g.pids() == [p.pid]
        g.close(kill=False)
        assert p.poll() is None
        assert cgroups.own_paths(p.pid)["memory"] == cgroups.own_paths()["memory"]
    finally:
        p.kill()
        p.wait()
        g.close()


def test_threads_that_ran_are_counted(group: Cgroup) -> None:
    window = Window(group, period=0.01).start()
    with group.spawning():
        p = _python(
            """
            import threading, time
            def spin():
                end = time.monotonic() + 0.5
                while time.monotonic() < end:
                    time.sleep(0.001)
            ts = [threading.Thread(target=spin) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            """
        )
    assert p.wait(60) == 0
    figures = window.stop()
    assert figures["threads_max"] >= 5  # the main thread and its four
    assert figures["threads_ran"] >= 5
    assert figures["thread_samples"] >= 2


def test_a_name_in_use_or_cpus_outside_the_parent_are_refused_and_leave_nothing() -> None:
    with Cgroup(_name()) as g:
        with pytest.raises(CgroupError, match="making"):
            Cgroup(g.name)
        assert all(path.is_dir() for path in g.dirs.values())
    name = _name()
    with pytest.raises(CgroupError, match="not in this process's cpuset"):
        Cgroup(name, cpus="0-4095")
    assert not cgroups.groups_named(name)
    with pytest.raises(ValueError):
        Cgroup("../escape")


def test_the_clients_get_the_cpus_the_server_leaves() -> None:
    assert cgroups.client_cpus("0-3", "0") == "1,2,3"
    assert cgroups.client_cpus("0-3", "1-2") == "0,3"
    assert cgroups.client_cpus("0-1", "0-1") is None  # none left: shared with the server
    assert cgroups.client_cpus("0-1", None) is None  # a server not pinned


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_rounds_clients_run_on_cpus_apart_from_its_server(tmp_path: Path) -> None:
    every = sorted(os.sched_getaffinity(0))
    with cgroups.RoundGroups(_name(), str(every[0])) as groups:
        assert groups.server.cpus == str(every[0])
        assert parse_cpus(groups.clients.cpus) == every[1:]
        out = tmp_path / "affinity"
        with groups.clients.spawning():
            code = "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
            p = _python(code, str(out))
        assert p.wait(60) == 0
        assert out.read_text() == repr(every[1:])
    with cgroups.RoundGroups(_name(), ",".join(map(str, every))) as groups:
        assert parse_cpus(groups.clients.cpus) == every  # nothing left: the clients share
