"""Errors of the platform orchestration; each carries the facts and says how to fix it."""

from __future__ import annotations

from pathlib import Path


class PlatformError(RuntimeError):
    """Base class: something about the node's processes is not as asked."""


class PortInUse(PlatformError):
    """A port that was configured explicitly is taken."""

    def __init__(self, part: str, host: str, port: int, setting: str) -> None:
        self.part, self.host, self.port, self.setting = part, host, port, setting
        super().__init__(
            f"port {port} on {host} for {part} is already in use; free it, choose another "
            f"({setting}=PORT), or let fedfaas pick a free one ({setting}=0)"
        )


class ServiceFailed(PlatformError):
    """A part did not start or did not become ready; the tail of its log says why."""

    def __init__(
        self, service: str, reason: str, log_path: Path | None = None, log_tail: str = ""
    ) -> None:
        self.service, self.reason, self.log_path, self.log_tail = (
            service,
            reason,
            log_path,
            log_tail,
        )
        msg = f"{service}: {reason}"
        if log_path is not None:
            msg += f" (log: {log_path})"
        if log_tail:
            msg += "\n--- last lines of the log ---\n" + log_tail.rstrip()
        super().__init__(msg)


class AlreadyRunning(PlatformError):
    """``up`` found the platform partly running in this state folder."""

    def __init__(self, state_dir: Path, alive: list[str], dead: list[str]) -> None:
        self.state_dir, self.alive, self.dead = state_dir, alive, dead
        super().__init__(
            f"the platform in {state_dir} is partly running (alive: {', '.join(alive) or '-'}; "
            f"down: {', '.join(dead) or '-'}); run `fedfaas down --state-dir {state_dir}` first"
        )


class StopFailed(PlatformError):
    """``down`` could not make every process of the platform exit."""

    def __init__(self, leftover: list[int]) -> None:
        self.leftover = leftover
        super().__init__(
            f"processes still alive after SIGKILL: {leftover}; check them with `ps -o pid,cmd -p "
            f"{','.join(map(str, leftover))}`"
        )


class StateDirError(PlatformError):
    """The state folder cannot be used (not a folder, not writable, locked by another run)."""
