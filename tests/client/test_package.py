"""The light client distribution (client/pyproject.toml): what it ships and what it needs.

``pip install ./client`` installs the package ``client`` with httpx, numpy and safetensors;
PyTorch and scikit-learn come only with its ``[torch]`` extra, Flower with ``[flower]``. The
SDK, the job handle and the Flower adapter import without any of them (nor the platform).
"""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what the light install lacks: the extras' packages and the platform's own
ABSENT = ("torch", "sklearn", "flwr", "torchvision", "fedfaas", "gateway", "control_plane",
          "cache_engine", "request_tracker", "fastapi", "redis", "minio")  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO / "client")],
        check=True, timeout=300,
    )  # fmt: skip
    [whl] = out.glob("fedfaas_client-*.whl")
    return whl


def test_the_wheel_ships_the_client_package_and_needs_only_the_light_dependencies(
    wheel: Path,
) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(next(n for n in names if n.endswith("METADATA"))))
    shipped = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    here = {f"client/{p.name}" for p in (REPO / "client").glob("*.py")}
    # secure aggregation's protocol: core/secagg's files, shipped under the client package
    here |= {f"client/_secagg/{p.name}" for p in (REPO / "core" / "secagg").glob("*.py")}
    assert shipped == here
    requires = sorted(meta.get_all("Requires-Dist") or [])
    assert [r for r in requires if "extra ==" not in r] == [
        "httpx>=0.27",
        "numpy>=1.26",
        "safetensors>=0.4",
    ]
    assert sorted(r for r in requires if 'extra == "torch"' in r) == [
        'scikit-learn>=1.4; extra == "torch"',
        'torch>=2.2; extra == "torch"',
    ]
    assert [r for r in requires if 'extra == "flower"' in r] == ['flwr>=1.8; extra == "flower"']
    assert sorted(r for r in requires if 'extra == "secagg"' in r) == [
        'cryptography>=42; extra == "secagg"',
        'pycryptodome>=3.20; extra == "secagg"',
    ]


BLOCKED_IMPORT = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
sys.path = [p for p in sys.path if p != {repo!r}]
sys.path.insert(0, {wheel!r})
"""


def _python(wheel: Path, code: str) -> subprocess.CompletedProcess[str]:
    setup = BLOCKED_IMPORT.format(absent=set(ABSENT), repo=str(REPO), wheel=str(wheel))
    return subprocess.run(
        [sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=120,
        cwd="/",
    )  # fmt: skip


def test_the_sdk_the_job_handle_and_the_flower_adapter_import_without_torch_or_the_platform(
    wheel: Path,
) -> None:
    out = _python(
        wheel,
        "import numpy as np, client, client.sdk, client.job, client.flower, client.errors\n"
        "from client.flower import flower_arrays, flower_weights\n"
        "from client.node import update_bytes\n"
        "assert client.__file__.startswith(sys.path[0]), client.__file__\n"
        "w = flower_weights([np.ones(3, np.float32)])\n"
        "assert flower_arrays(w)[0].tolist() == [1, 1, 1]\n"
        "assert update_bytes({'a': np.zeros(2, np.float32)})[:8]\n"
        "assert not {m.split('.')[0] for m in sys.modules} & " + repr(set(ABSENT)) + "\n"
        "print('light')",
    )
    assert out.returncode == 0 and out.stdout.strip() == "light", out.stderr
    # what needs the [torch] extra says so
    out = _python(wheel, "import client.model")
    assert out.returncode != 0 and "No module named 'torch'" in out.stderr
    out = _python(wheel, "from client.data import federated_digits; federated_digits(4)")
    assert out.returncode != 0 and "No module named 'sklearn'" in out.stderr


def test_secure_aggregation_s_participant_runs_from_the_wheel_alone(wheel: Path) -> None:
    """client.secure takes the protocol from the wheel's client._secagg (core/secagg's files)
    when there is no ``core``: a job's initial weights laid out, a round's first stages."""
    blocked = {*ABSENT, "core"}
    setup = BLOCKED_IMPORT.format(absent=blocked, repo=str(REPO), wheel=str(wheel))
    code = (
        "import numpy as np\n"
        "from safetensors.numpy import save\n"
        "from client import secure\n"
        "from client._secagg.participant import Participant\n"
        "assert secure.Participant is Participant\n"
        "w = {'b': np.ones(2, np.float32), 'a': np.arange(6, dtype=np.float32).reshape(2, 3)}\n"
        "masked = secure.masked_initial_weights(save(w), {'neighbours': 2})\n"
        "meta = secure.metadata_of(masked)\n"
        "assert '\"neighbours\": 2' in meta[secure.METADATA_KEY], meta\n"
        "cfg = secure.SecAggConfig.from_spec({'neighbours': 2})\n"
        "ctx = secure.context('j', 1)\n"
        "ps = {c: Participant(cfg, c, ctx) for c in ('x', 'y', 'z')}\n"
        "roster = {c: p.advertise() for c, p in ps.items()}\n"
        "assert set(ps['x'].share_keys(roster)) == {'y', 'z'}\n"
        "assert not {m.split('.')[0] for m in sys.modules} & " + repr(blocked) + "\n"
        "print('secure')"
    )
    out = subprocess.run(
        [sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=120,
        cwd="/",
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "secure", out.stderr
