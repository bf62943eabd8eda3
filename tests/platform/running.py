"""``fedfaas up`` for the length of a test or a fixture, stopped whatever happens.

A fixture that runs ``fedfaas up`` and only then enters its ``try``/``finally`` leaves a
half-started platform running when ``up`` fails or is killed at its timeout (pytest-timeout's or
``subprocess``'s): ``up`` tears down after its own errors, but a killed ``up`` cannot, and the parts
it had started stay up. :func:`running_platform` runs ``fedfaas down`` on every way out, ``up``'s
own failure included, and then checks that no process of the platform outlived it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil

from fedfaas.platform import state
from fedfaas.platform.context import PLATFORM_ID_VAR
from tests.commands import run_module
from tests.platform.conftest import ANY_PORTS_ENV

log = logging.getLogger(__name__)

#: The parts ``--with all`` adds whose ports ``FEDFAAS_PORTS`` may set (0: any free port).
OPTIONAL_PORTS = ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane")


def any_ports_env(**extra: str) -> dict[str, str]:
    """This process's environment with every part of ``fedfaas up --with all`` on a free port
    (and no ``OPENFAAS_URL`` from the caller's shell), plus ``extra``."""
    env = {
        **os.environ,
        **ANY_PORTS_ENV,
        "FEDFAAS_PORTS": json.dumps(dict.fromkeys(OPTIONAL_PORTS, 0)),
        **extra,
    }
    env.pop("OPENFAAS_URL", None)
    return env


def fedfaas(*args: str, env: Mapping[str, str], timeout: float = 300) -> None:
    """Run ``fedfaas ARGS`` and require it to succeed (its output in the failure)."""
    out = run_module("fedfaas.cli", *args, timeout=timeout, env=env)
    assert out.returncode == 0, out.stdout + out.stderr


def platform_processes(platform: state.PlatformState) -> set[int]:
    """The platform's live processes: its parts (from its state), everything they started, and
    every process whose environment carries the platform's id. Zombies are not alive: a part
    whose parent (a killed ``fedfaas up``) is gone waits for init to reap it."""
    pids: set[int] = set()
    for rec in platform.services:
        try:
            part = psutil.Process(rec.pid)
            family = [part, *part.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        pids |= {p.pid for p in family if _alive(p)}
    mark = f"{PLATFORM_ID_VAR}={platform.platform_id}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    pids.add(int(d.name))
            except OSError:
                continue
    return pids


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_platform(state_dir: Path, env: Mapping[str, str]) -> set[int]:
    """``fedfaas down`` in ``state_dir``, whatever state the platform is in (none, half-started,
    running); the platform's processes still alive after it (empty when ``down`` did its job)."""
    before = state.load(state_dir)
    out = run_module("fedfaas.cli", "down", "--state-dir", str(state_dir), timeout=300, env=env)
    if out.returncode != 0:
        log.error("fedfaas down in %s failed: %s%s", state_dir, out.stdout, out.stderr)
    return set() if before is None else platform_processes(before)


@contextlib.contextmanager
def running_platform(
    state_dir: Path,
    *up_args: str,
    env: Mapping[str, str],
    timeout: float = 600,
    tls: bool = False,
) -> Iterator[state.PlatformState]:
    """``fedfaas up UP_ARGS --state-dir STATE_DIR`` for the ``with`` block's length.

    ``tls=True`` runs ``fedfaas up``'s default (TLS, no flag); ``tls=False`` passes
    ``--no-tls``: the tests that take this platform are about something else, and their
    plain-HTTP calls would be noise to TLS. The default itself is run by
    tests/platform/test_cli.py, tests/demo, tests/docs and tests/tls/test_platform_tls.py.

    ``fedfaas down`` runs on every way out: the block's end, its error, and ``up``'s failure or
    timeout half-way. A platform process outliving ``down`` fails the block (when nothing else
    did already: then it is logged, not to hide the first error).
    """
    failed = True
    try:
        flags = () if tls else ("--no-tls",)
        fedfaas("up", *up_args, *flags, "--state-dir", str(state_dir), env=env, timeout=timeout)
        st = state.load(state_dir)
        assert st is not None, f"fedfaas up wrote no state in {state_dir}"
        yield st
        failed = False
    finally:
        left = stop_platform(state_dir, env)
        if left and failed:
            log.error("platform processes %s outlived fedfaas down in %s", sorted(left), state_dir)
        assert failed or not left, f"platform processes {sorted(left)} outlived fedfaas down"
