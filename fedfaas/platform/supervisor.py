"""The supervisor: starts again any part of a running platform whose process died.

``fedfaas up`` starts it last and ``fedfaas down`` stops it first. Every ``interval`` seconds it
looks at the recorded parts; a dead one is started again on its recorded ports
(:meth:`fedfaas.platform.orchestrator.Platform.revive`) and recovers its own state. A part that
keeps dying is started again after a delay that doubles from ``backoff_s`` up to ``max_backoff_s``
(Kubernetes' CrashLoopBackOff), reset once it has run for ``stable_s``. The supervisor exits when
the platform's state is gone (``down`` ran).

    python -m fedfaas.platform.supervisor --state-dir DIR
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedfaas.platform.errors import PlatformError, StateDirError

log = logging.getLogger("fedfaas.supervisor")


@dataclass
class Backoff:
    """When each part may be started again: CrashLoopBackOff's doubling delay."""

    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stable_s: float = 60.0
    delay: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    def ready(self, name: str, now: float) -> bool:
        """May ``name`` (dead now) start again at ``now``?"""
        last = self.started.get(name)
        if last is None:
            return True
        if now - last >= self.stable_s:  # it ran long enough: a fresh crash, no delay
            self.delay.pop(name, None)
            return True
        return now - last >= self.delay.get(name, 0.0)

    def note_start(self, name: str, now: float) -> None:
        last = self.started.get(name)
        if last is not None and now - last < self.stable_s:
            self.delay[name] = min(
                self.max_backoff_s, max(self.backoff_s, 2 * self.delay.get(name, 0.0))
            )
        self.started[name] = now


def supervise(state_dir: Path, interval: float = 0.5, stop: threading.Event | None = None) -> None:
    """Revive dead parts of the platform in ``state_dir`` until it is taken down."""
    from fedfaas.platform.orchestrator import Platform
    from fedfaas.settings import load_settings

    stop = stop or threading.Event()
    platform = Platform(load_settings(state_dir=state_dir))
    backoff = Backoff()
    while not stop.wait(interval):
        try:
            dead = platform.dead_parts()
        except StateDirError as exc:
            log.warning("state unreadable: %s", exc)
            continue
        if not (state_dir / "state.json").exists():
            log.info("the platform in %s is down; the supervisor exits", state_dir)
            return
        now = time.monotonic()
        due = [n for n in dead if n != "supervisor" and backoff.ready(n, now)]
        if not due:
            continue
        for name in due:
            backoff.note_start(name, now)
        try:
            started = platform.revive(due)
        except StateDirError:
            continue  # `up` or `down` at work: look again next time
        except PlatformError as exc:
            log.error("restart failed: %s", exc)
            continue
        if started:
            log.warning("restarted %s", ", ".join(started))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedfaas.platform.supervisor")
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    supervise(args.state_dir.resolve(), args.interval, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
