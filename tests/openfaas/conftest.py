"""Conformance with OpenFaaS's own programs, built from upstream (the tests here run faas-cli;
:func:`require_binary` finds gateway and of-watchdog the same way).

The binaries are found in the folder ``$FEDFAAS_OPENFAAS_BIN``, else on ``PATH``. Where one is
missing its tests skip, naming it; under CI (``FEDFAAS_OPENFAAS_BIN`` or ``CI`` set) they fail
instead, so a CI run never passes without having run them (``.ci/run`` exports the variable
when ``../shared/openfaas/bin`` exists).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime import RuntimeProcess

BIN_ENV = "FEDFAAS_OPENFAAS_BIN"
#: the faas-cli commands the tests ran (``secret create``, ``list``, ...), reported at the end
EXERCISED: set[str] = set()
# faas-cli commands with a sub-command
_GROUPS = {"secret", "namespace", "template", "store", "plugin", "chart"}


def under_ci() -> bool:
    return bool(os.environ.get(BIN_ENV) or os.environ.get("CI"))


def find_binary(name: str) -> Path | None:
    """``$FEDFAAS_OPENFAAS_BIN/<name>`` when the variable is set, else ``<name>`` on PATH."""
    folder = os.environ.get(BIN_ENV)
    if folder:
        path = Path(folder) / name
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(name)
    return Path(found) if found else None


def require_binary(name: str) -> Path:
    """The binary ``name``; skips the test where it is missing, fails under CI."""
    path = find_binary(name)
    if path is not None:
        return path
    where = f"${BIN_ENV} ({os.environ[BIN_ENV]})" if os.environ.get(BIN_ENV) else "PATH"
    reason = (
        f"the real OpenFaaS binary {name!r} is not in {where}: set {BIN_ENV} to the folder "
        "holding faas-cli, gateway and of-watchdog"
    )
    if under_ci():
        pytest.fail(f"under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def text(output: bytes) -> str:
    """faas-cli output as text, without its terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", output.decode(errors="replace"))


@dataclass
class FaasCli:
    """The real faas-cli with a HOME of its own (its login lives in ``$HOME/.openfaas``)."""

    binary: Path
    home: Path
    gateway: str | None = None
    #: the commands run (``secret create``, ``list``, ...)
    commands: set[str] = field(default_factory=set)

    def __call__(
        self, *args: str, stdin: bytes | str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``faas-cli ARGS [--gateway URL]`` in ``cwd`` (default: the HOME, since faas-cli
        reads a ``stack.yml`` of its working folder); stdout and stderr as bytes."""
        command = " ".join(args[:2] if args[0] in _GROUPS and len(args) > 1 else args[:1])
        self.commands.add(command)
        EXERCISED.add(command)
        argv = [str(self.binary), *args]
        if self.gateway is not None:
            argv += ["--gateway", self.gateway]
        # HOME and PATH only: no OPENFAAS_URL, proxy or other setting of the caller leaks in
        env = {"HOME": str(self.home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return subprocess.run(
            argv,
            input=data,
            capture_output=True,
            env=env,
            cwd=cwd or self.home,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str, stdin: bytes | str | None = None, cwd: Path | None = None) -> str:
        """Run and require exit status 0; the stdout as text, colour codes removed."""
        out = self(*args, stdin=stdin, cwd=cwd)
        assert out.returncode == 0, (args, text(out.stdout), text(out.stderr))
        return text(out.stdout)


@pytest.fixture(scope="session")
def faas_cli_binary() -> Path:
    return require_binary("faas-cli")


@pytest.fixture()
def faas_cli(faas_cli_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> FaasCli:
    """faas-cli with an empty HOME of the test's own (never the user's ~/.openfaas)."""
    return FaasCli(faas_cli_binary, tmp_path_factory.mktemp("faas-cli-home"))


@pytest.fixture(scope="module")
def openfaas_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    """The embedded runtime (no stack file: deployments name their handler folder with the
    ``com.fedfaas.handler`` annotation), with random basic-auth credentials (``rt.auth``)."""
    rt = RuntimeProcess(state_dir=tmp_path_factory.mktemp("openfaas-runtime")).start()
    try:
        yield rt
    finally:
        rt.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if EXERCISED:
        terminalreporter.write_line(
            f"faas-cli commands exercised: {len(EXERCISED)}: {', '.join(sorted(EXERCISED))}"
        )


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def require_prometheus() -> Path:
    """Debian's ``prometheus`` (``make setup`` installs it; the real gateway needs one); skips
    the test where it is missing, fails it under CI (as :func:`require_binary`)."""
    from core.services import find_binary as find_service_binary

    found = find_service_binary("prometheus")
    if found is not None:
        return Path(found)
    reason = "prometheus is not installed: run `make setup` (apt-get install prometheus)"
    if under_ci():
        pytest.fail(f"under CI: {reason}", pytrace=False)
    pytest.skip(reason)


#: OpenFaaS's gateway listens on these, fixed
GATEWAY_FIXED_PORTS = (8080, 8082)


@contextlib.contextmanager
def holding_fixed_ports(ports: tuple[int, ...], who: str) -> Iterator[None]:
    """Hold the machine-wide lock of ``ports`` for the block, then require them free.

    ``make test`` runs test modules on two pytest-xdist workers at once; the modules that start
    a program on fixed ports (OpenFaaS's gateway on :8080 and :8082) take this lock first, for
    as long as the program may run, so they run one after another. A lock file, released by the
    kernel when its holder dies.
    """
    name = "-".join(str(p) for p in ports)
    with open(Path(tempfile.gettempdir()) / f"fedfaas-tests-ports-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for port in ports:
            require_free_port(port, who)
        yield


def require_free_port(port: int, who: str) -> None:
    """Skips the test when ``port`` is taken (a listener on any interface), fails it under CI;
    ``who`` listens there at a fixed port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: connections in TIME_WAIT do not count, a listener does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return
        except OSError:
            pass
    reason = f"port {port} is taken; {who} listens on it (fixed)"
    if under_ci():
        pytest.fail(f"under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    """See :func:`require_prometheus`."""
    return require_prometheus()
