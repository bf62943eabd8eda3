"""``make test`` runs the default tier on pytest-xdist workers; what keeps them apart.

docs/operations.md says: each test module runs whole on one worker, the modules that start
OpenFaaS's gateway on its fixed ports hold a lock, so they run one after another, and each
worker's servers take their ports from a range of their own. These tests run pytest with two
real workers, as the Makefile runs them, over throw-away test modules that use this
repository's ``tests/conftest.py`` and the lock of ``tests/openfaas/conftest.py``, and read
where, when and with which port range each test ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.services import free_port
from tests.test_makefile import PARENT_MAKE_VARS, dry_run, recipe_problem

ROOT = Path(__file__).resolve().parents[1]

_RECORD = """
import json, os, time
from pathlib import Path

def record(name):
    from core.services import free_port
    out = Path(os.environ["RECORD_DIR"]) / f"{name}.json"
    start = time.monotonic()
    time.sleep(0.3)  # long enough for the other worker to run something meanwhile
    out.write_text(json.dumps({
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "range": os.environ.get("FEDFAAS_PORT_RANGE"),
        "port": free_port(),
        "start": start, "end": time.monotonic(),
    }))
"""


_FIXED = """
@pytest.fixture(scope="module", autouse=True)
def _fixed():
    ports = tuple(int(p) for p in os.environ["FIXED_PORTS"].split(","))
    with holding_fixed_ports(ports, "a throw-away server"):
        yield
"""


def _module(fixed: bool, name: str) -> str:
    head = "import os\nimport pytest\nfrom recorder import record\n"
    head += "from tests.openfaas.conftest import holding_fixed_ports\n"
    tests = "".join(f"def test_{name}_{i}():\n    record('{name}_{i}')\n\n" for i in range(3))
    return head + (_FIXED if fixed else "") + "\n" + tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Where, when and with which port range each of the throw-away tests ran."""
    tmp_path = tmp_path_factory.mktemp("two-workers")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "from tests.conftest import pytest_configure  # noqa: F401\n"
    )
    (suite / "recorder.py").write_text(_RECORD)
    (suite / "test_fixed_a.py").write_text(_module(True, "fixed_a"))
    (suite / "test_fixed_b.py").write_text(_module(True, "fixed_b"))
    for name in ("plain_c", "plain_d", "plain_e"):
        (suite / f"test_{name}.py").write_text(_module(False, name))
    records = tmp_path / "records"
    records.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in PARENT_MAKE_VARS}
    env.pop("FEDFAAS_PORT_RANGE", None)  # as a fresh `make test` starts
    env.pop("PYTEST_XDIST_WORKER", None)
    fixed = f"{free_port()},{free_port()}"  # not OpenFaaS's: its real tests may run meanwhile
    env |= {"RECORD_DIR": str(records), "FIXED_PORTS": fixed}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{suite}"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    argv += ["--dist", "loadfile", "--rootdir", str(suite), "-c", os.devnull, str(suite)]
    res = subprocess.run(argv, cwd=suite, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    return {p.stem: json.loads(p.read_text()) for p in records.glob("*.json")}


def test_modules_run_whole_on_one_worker_and_fixed_port_modules_one_after_another(
    runs: dict[str, dict[str, object]],
) -> None:
    assert len(runs) == 15
    by_module: dict[str, set[object]] = {}
    for name, run in runs.items():
        by_module.setdefault(name.rsplit("_", 1)[0], set()).add(run["worker"])
    assert all(len(workers) == 1 for workers in by_module.values()), by_module
    assert {w for ws in by_module.values() for w in ws} == {"gw0", "gw1"}  # both workers ran
    fixed = sorted((r["start"], r["end"]) for n, r in runs.items() if n.startswith("fixed"))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(fixed, fixed[1:], strict=False))


def test_each_worker_draws_ports_from_a_range_of_its_own(
    runs: dict[str, dict[str, object]],
) -> None:
    ranges: dict[object, tuple[int, int]] = {}
    for run in runs.values():
        first, last = (int(x) for x in str(run["range"]).split("-"))
        assert first <= int(str(run["port"])) <= last  # free_port honoured the worker's range
        assert ranges.setdefault(run["worker"], (first, last)) == (first, last)
    (a_first, a_last), (b_first, b_last) = sorted(ranges.values())
    assert len(ranges) == 2 and a_last < b_first  # disjoint


def test_make_test_runs_the_default_tier_on_two_workers_a_module_each() -> None:
    res = dry_run("test")
    assert recipe_problem(res) is None
    assert re.search(r'pytest -m "not slow" -n 2 --dist loadfile ', res.stdout), res.stdout
    assert re.search(r"-n 1 --dist loadfile ", dry_run("test", "TEST_WORKERS=1").stdout)
