"""``up``, ``down`` and ``status`` of one node's platform, driven by the list of parts."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from core.services import ServiceError
from core.services.process import PORT_RANGE_ENV, PortRangeFull, free_ports
from fedfaas.platform import credentials, ebpf, optional, pki, procs, state
from fedfaas.platform import openfaas_gateway as openfaas_gateway_parts
from fedfaas.platform.context import PLATFORM_ID_VAR, Context
from fedfaas.platform.errors import (
    AlreadyRunning,
    PlatformError,
    PortInUse,
    ServiceFailed,
    StateDirError,
    StopFailed,
)
from fedfaas.platform.functions import FunctionInfo, list_functions
from fedfaas.platform.parts import PARTS, SUPERVISOR, ServiceSpec, ordered
from fedfaas.platform.state import PlatformState, ServiceRecord
from fedfaas.settings import DEFAULT_PORTS, PlatformSettings

log = logging.getLogger(__name__)

#: passes of ``down``'s sweep for the platform's processes left once its parts are stopped
SWEEPS = 3


@dataclass
class PartStatus:
    """One part as ``status`` sees it."""

    name: str
    address: str
    pid: int
    alive: bool
    ready: bool
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class StatusReport:
    """What ``fedfaas status`` prints (and, with ``--json``, emits)."""

    state_dir: str
    running: bool
    parts: list[PartStatus] = field(default_factory=list)
    functions: list[FunctionInfo] = field(default_factory=list)
    functions_error: str = ""
    ebpf_mode: str = "userspace"
    ebpf_reason: str = ""
    #: the platform's CA certificate (``fedfaas up``, TLS by default; the SDK's ``ca_file``), else ""
    tls_ca: str = ""

    @property
    def healthy(self) -> bool:
        """True when the platform runs, every part is alive and ready, every function too."""
        return (
            self.running
            and all(p.alive and p.ready for p in self.parts)
            and not self.functions_error
            and all(f.ready for f in self.functions)
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["healthy"] = self.healthy
        return out


@dataclass
class UpResult:
    state: PlatformState
    already_running: bool


def _setting_name(port_name: str) -> str:
    if port_name in DEFAULT_PORTS:
        return f"FEDFAAS_{port_name.upper()}_PORT"
    return f"FEDFAAS_PORTS (key {port_name!r})"


class Platform:
    """The processes of one node, recorded in one state folder.

    Parameters
    ----------
    settings
        Where the state lives and which ports to take.
    parts
        The parts to run, in any order that respects ``depends`` (default :data:`PARTS`).
    openfaas_gateway
        OpenFaaS's gateway binary: runs it (and a Prometheus) in front of the runtime, and the
        optional parts reach the functions through it (:mod:`fedfaas.platform.openfaas_gateway`).
    """

    def __init__(
        self,
        settings: PlatformSettings,
        parts: list[ServiceSpec] | None = None,
        openfaas_gateway: Path | None = None,
    ) -> None:
        self.settings = settings
        self.openfaas_gateway = openfaas_gateway
        if parts is None:
            front = openfaas_gateway_parts.PARTS if openfaas_gateway is not None else []
            try:
                # --with prometheus beside --openfaas-gateway: one Prometheus for both
                extra = [p for p in optional.resolve(settings.with_parts) if p not in front]
                parts = [*PARTS, *front, *extra, SUPERVISOR]
            except KeyError as exc:
                raise PlatformError(
                    f"unknown part {exc.args[0]!r}; choose from {', '.join(optional.OPTIONAL)} "
                    f"or all"
                ) from None
        self.parts = ordered(list(parts))
        self.state_dir = Path(settings.state_dir)

    def _spec(self, name: str) -> ServiceSpec | None:
        """The spec of a recorded part: one of ours, else a known core or optional part."""
        known = (*PARTS, *openfaas_gateway_parts.PARTS, *optional.OPTIONAL.values(), SUPERVISOR)
        for p in (*self.parts, *known):
            if p.name == name:
                return p
        return None

    # --- up ---------------------------------------------------------------------------------

    def up(self) -> UpResult:
        """Start every part in order, each ready before the next; deploy the stack.

        Idempotent: when every recorded part is still alive, nothing is started. A partly
        running platform is an error (:class:`AlreadyRunning`). On any failure everything
        started so far is stopped again and the logs are kept; a rollback that does not finish
        keeps the state record, so ``down`` can stop what is left.
        """
        state.prepare_dir(self.state_dir)
        with state.locked(self.state_dir):
            existing = state.load(self.state_dir)
            if existing is not None:
                alive = [r.name for r in existing.services if r.alive()]
                dead = [r.name for r in existing.services if r.name not in alive]
                missing = [p.name for p in self.parts if existing.record(p.name) is None]
                if alive and not dead and not missing:
                    log.info("platform already running in %s", self.state_dir)
                    return UpResult(existing, already_running=True)
                if alive:
                    raise AlreadyRunning(self.state_dir, alive, dead + missing)
                log.warning("removing stale state of a platform that is no longer running")
                self._teardown(existing)
            state.clean(self.state_dir, keep_logs=True)
            if not self.settings.stack_file.is_file():
                raise PlatformError(
                    f"stack file {self.settings.stack_file} not found; pass "
                    f"--stack FILE or set FEDFAAS_STACK_FILE"
                )
            ctx = Context(
                state_dir=self.state_dir,
                host=self.settings.host,
                stack_file=self.settings.stack_file,
                platform_id=uuid.uuid4().hex,
                ports=self._choose_ports(),
                stop_timeout=self.settings.stop_timeout,
                functions_timeout=self.settings.functions_timeout,
                openfaas_gateway=self.openfaas_gateway,
                shm_dir=self.settings.shm_dir,
                tls=self.settings.tls,
            )
            credentials.ensure(ctx.secrets_dir)
            if ctx.tls:
                pki.mint(ctx)
            st = PlatformState(
                state_dir=str(self.state_dir),
                platform_id=ctx.platform_id,
                host=ctx.host,
                stack_file=str(ctx.stack_file),
                started_at=time.time(),
                ports=dict(ctx.ports),
                shm_dir=str(ctx.shm_dir),
                tls=ctx.tls,
            )
            state.save(st)
            try:
                for part in self.parts:
                    self._start(part, ctx, st)
                st.ebpf = list(ebpf.probe())
                state.save(st)
            except BaseException:
                log.error("start failed; stopping what was started")
                # the record goes only once nothing it names runs: a rollback cut short (a
                # second Ctrl-C, a process that survived SIGKILL) keeps it, for `down` to finish
                self._teardown(st)
                state.clean(self.state_dir, keep_logs=True)
                raise
            return UpResult(st, already_running=False)

    def _choose_ports(self) -> dict[str, int]:
        host = self.settings.host
        chosen: dict[str, int] = {}
        # fixed ports first, so that no other part's usual port takes one of them
        for part in self.parts:
            for ps in part.ports:
                if ps.fixed:
                    busy = ps.default in chosen.values() or not all(
                        procs.port_free(h, ps.default) for h in (host, "0.0.0.0")
                    )
                    if busy:
                        raise PlatformError(
                            f"port {ps.default} is in use; {part.name} listens on it (a fixed "
                            f"port, on every interface): free it"
                        )
                    chosen[ps.name] = ps.default
        drawn: list[tuple[str, int]] = []  # (port name, its usual port if that was taken, else 0)
        for part in self.parts:
            for ps in part.ports:
                if ps.fixed:
                    continue
                configured = self.settings.port_setting(ps.name)
                taken = set(chosen.values())
                if configured:
                    if configured in taken or not procs.port_free(host, configured):
                        raise PortInUse(part.name, host, configured, _setting_name(ps.name))
                    chosen[ps.name] = configured
                elif (
                    configured is None
                    and ps.default
                    and ps.default not in taken
                    and procs.port_free(host, ps.default)
                ):
                    chosen[ps.name] = ps.default
                else:
                    drawn.append((ps.name, ps.default if configured is None else 0))
        # the rest drawn together, each different from every port chosen above
        try:
            ports = free_ports(len(drawn), host, exclude=chosen.values(), strict=True)
        except PortRangeFull as exc:
            raise PlatformError(
                f"the platform needs {exc.needed} free ports on {host} for "
                f"{', '.join(name for name, _ in drawn)}, and the range it draws them from, "
                f"{exc.first}-{exc.last}, has {exc.found} free: widen {PORT_RANGE_ENV} "
                f"(FIRST-LAST) or give these parts ports of their own"
            ) from None
        for (name, usual), port in zip(drawn, ports, strict=True):
            if usual:
                log.info("port %d for %s is taken; using %d", usual, name, port)
            chosen[name] = port
        return chosen

    def _start(self, part: ServiceSpec, ctx: Context, st: PlatformState) -> None:
        rec = self._launch(part, ctx, "fedfaas up")
        st.services.append(rec)
        state.save(st)
        self._await_ready(part, ctx, rec)

    def _launch(self, part: ServiceSpec, ctx: Context, why: str) -> ServiceRecord:
        """Prepare ``part`` and start its process; the record says how to find it again."""
        log_path = ctx.log_path(part.name)
        try:
            part.prepare(ctx)
            argv = part.argv(ctx)
            env = {**os.environ, **ctx.env(), **part.env(ctx)}
            with open(log_path, "a") as f:
                f.write(f"=== {why} {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n")
            cwd = part.cwd(ctx) if part.cwd else ctx.state_dir
            pid, created, ticks = procs.spawn_daemon(argv, env=env, log_path=log_path, cwd=cwd)
        except (ServiceError, OSError) as exc:  # a binary or a folder that is not there
            raise ServiceFailed(part.name, f"cannot start: {exc}") from exc
        return ServiceRecord(
            name=part.name,
            pid=pid,
            create_time=created,
            start_ticks=ticks,
            ports={p.name: ctx.ports[p.name] for p in part.ports},
            address=part.address(ctx),
            log=str(log_path),
            extra=part.extra(ctx),
        )

    def _await_ready(self, part: ServiceSpec, ctx: Context, rec: ServiceRecord) -> None:
        """Poll ``part`` until it is ready, then run its ``after_start``."""
        log_path = Path(rec.log)
        timeout = part.start_timeout or self.settings.start_timeout
        deadline = time.monotonic() + timeout
        while not part.ready(ctx):
            if not rec.alive():
                code = procs.exit_code(rec.pid)
                raise ServiceFailed(
                    part.name,
                    f"exited with code {code} before it was ready",
                    log_path,
                    procs.log_tail(log_path),
                )
            if time.monotonic() > deadline:
                raise ServiceFailed(
                    part.name, f"not ready after {timeout:.0f}s", log_path, procs.log_tail(log_path)
                )
            time.sleep(0.1)
        log.info("%s ready at %s (pid %d)", part.name, rec.address, rec.pid)
        try:
            part.after_start(ctx)
        except PlatformError as exc:
            raise ServiceFailed(part.name, str(exc), log_path, procs.log_tail(log_path)) from exc

    # --- revive (the supervisor's step) --------------------------------------------------------

    def dead_parts(self) -> list[str]:
        """Recorded parts whose process is gone, in start order (empty when nothing runs)."""
        st = state.load(self.state_dir) if self.state_dir.is_dir() else None
        if st is None:
            return []
        return [r.name for r in st.services if not r.alive()]

    def revive(self, names: list[str]) -> list[str]:
        """Start again those of ``names`` whose process died, on their recorded ports.

        What a kubelet or systemd does for a crashed service: the part runs again with the same
        command line, secrets and data, and recovers its own state (a node gateway from its
        journal and shared memory, the control plane from Redis). Each restart is counted in
        the part's ``restarts`` (shown by ``status``) and logged in its log. Parts are started
        in their start order and each is ready before the next, as in :meth:`up`.

        Returns the parts started. Nothing is done while another command holds the state folder
        (``up`` or ``down`` at work): :class:`StateDirError` then.
        """
        started: list[tuple[ServiceSpec, ServiceRecord]] = []
        with state.locked(self.state_dir):
            st = state.load(self.state_dir)
            if st is None:
                return []
            ctx = self._context(st)
            for i, rec in enumerate(st.services):
                if rec.name not in names or rec.alive():
                    continue
                spec = self._spec(rec.name)
                if spec is None:
                    continue
                count = int(rec.extra.get("restarts", "0")) + 1
                new = self._launch(spec, ctx, f"restart {count} after pid {rec.pid} died:")
                new.extra["restarts"] = str(count)
                st.services[i] = new
                state.save(st)
                started.append((spec, new))
                log.warning("%s died (pid %d); restarted as pid %d", rec.name, rec.pid, new.pid)
        for spec, new in started:
            self._await_ready(spec, ctx, new)
        return [spec.name for spec, _ in started]

    # --- down -------------------------------------------------------------------------------

    def down(self, purge: bool = False) -> list[str]:
        """Stop every part (reverse order) and every process they started; clean the folder.

        Parameters
        ----------
        purge
            Remove the state folder entirely, logs included (default: keep ``logs/``).

        Returns
        -------
        list of str
            Names of the parts that were running.

        Raises
        ------
        StopFailed
            If a process survives SIGKILL; the state is kept so ``down`` can be run again.
        """
        if not self.state_dir.exists():
            return []
        if not self.state_dir.is_dir():
            raise StateDirError(f"state folder {self.state_dir} is not a folder")
        # the supervisor first, and without the lock (it may hold it for a moment, reviving a
        # part): nothing may start again while the others are stopped
        supervised = self._stop_supervisor()
        with state.locked(self.state_dir, wait_s=self.settings.stop_timeout):
            st = state.load(self.state_dir)
            stopped: list[str] = []
            if st is not None:
                stopped = [r.name for r in st.services if r.name == supervised or r.alive()]
                self._teardown(st)
            state.clean(self.state_dir, keep_logs=not purge)
            left = state.leftovers(self.state_dir)
            if left:
                raise PlatformError(f"could not clean {self.state_dir}: {left} remain")
            return stopped

    def _stop_supervisor(self) -> str | None:
        """Stop the supervisor alone (the parts it restarted are its children, and each is
        stopped in its turn, reverse start order, not all at once with it); its name if it ran."""
        st = state.load(self.state_dir)
        rec = None if st is None else st.record(SUPERVISOR.name)
        if rec is None or not rec.alive():
            return None
        with contextlib.suppress(psutil.Error):
            procs.kill_all([psutil.Process(rec.pid)], self.settings.stop_timeout)
        return rec.name

    def _teardown(self, st: PlatformState) -> None:
        """Stop every process of ``st``, then run the parts' cleanups (e.g. /dev/shm)."""
        self._stop(st)
        ctx = self._context(st)
        for rec in reversed(st.services):
            spec = self._spec(rec.name)
            if spec is not None:
                spec.cleanup(ctx)

    def _stop(self, st: PlatformState) -> None:
        """Stop every recorded part, reverse start order, with all it started; then sweep the
        platform's processes left (:func:`procs.marked`: its id in their environment, or a
        working folder of its own), pass after pass, for processes started meanwhile (a
        replica the runtime started again as it stopped). Returns once none is left."""
        stuck: list[int] = []  # survived SIGKILL (a process in uninterruptible sleep)
        for rec in reversed(st.services):
            if rec.alive():
                log.info("stopping %s (pid %d)", rec.name, rec.pid)
            stuck += procs.stop_tree(
                rec.pid, rec.create_time, self.settings.stop_timeout, rec.start_ticks
            )
        ctx = self._context(st)
        folders = [ctx.state_dir / "data", ctx.state_dir / "run"]
        for sweep in range(1, SWEEPS + 1):
            stray = procs.marked(PLATFORM_ID_VAR, st.platform_id, folders)
            if not stray:
                break
            log.warning(
                "stopping %d stray process(es) of this platform (sweep %d): %s",
                len(stray),
                sweep,
                [p.pid for p in stray],
            )
            procs.kill_all(stray, self.settings.stop_timeout)
        left = {p.pid for p in procs.marked(PLATFORM_ID_VAR, st.platform_id, folders)}
        left.update(pid for pid in stuck if procs.is_alive(pid))
        if left:
            raise StopFailed(sorted(left))

    def _context(self, st: PlatformState) -> Context:
        ctx = Context.of(st)
        ctx.stop_timeout = self.settings.stop_timeout
        ctx.functions_timeout = self.settings.functions_timeout
        return ctx

    # --- status -----------------------------------------------------------------------------

    def status(self, probe_ebpf: bool = True) -> StatusReport:
        """Each part's address, PID, liveness and readiness, the functions, and the eBPF mode."""
        report = StatusReport(state_dir=str(self.state_dir), running=False)
        st = state.load(self.state_dir) if self.state_dir.is_dir() else None
        if st is None:
            if probe_ebpf:
                report.ebpf_mode, report.ebpf_reason = ebpf.probe()
            return report
        report.running = True
        ctx = self._context(st)
        report.tls_ca = str(ctx.ca_file) if ctx.tls else ""
        for rec in st.services:
            alive = rec.alive()
            spec = self._spec(rec.name)
            ready = alive and (spec.ready(ctx) if spec is not None else True)
            report.parts.append(
                PartStatus(rec.name, rec.address, rec.pid, alive, ready, dict(rec.extra))
            )
        for name in (p.name for p in self.parts):
            if st.record(name) is None:
                report.parts.append(PartStatus(name, "-", 0, False, False, {"note": "not started"}))
        if probe_ebpf:
            # the running gateway knows which router it uses; without one, probe the machine
            gw = next((p for p in report.parts if p.name == "gateway" and p.ready), None)
            mode = optional.gateway_router(ctx) if gw is not None else None
            recorded = (st.ebpf[0], st.ebpf[1]) if len(st.ebpf) == 2 else None
            report.ebpf_mode, report.ebpf_reason = mode or recorded or ebpf.probe()
        runtime = next((p for p in report.parts if p.name == "runtime"), None)
        if runtime is not None and runtime.ready:
            try:
                report.functions = list_functions(ctx)
            except PlatformError as exc:
                report.functions_error = str(exc)
        return report
