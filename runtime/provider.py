"""The Provider: deployed functions, their replica processes, and the health loop that keeps them."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from core.node import NODE_ENV, ROUTER_SOCKET_ENV
from runtime import validation
from runtime.errors import (
    FunctionExists,
    FunctionNotFound,
    InvalidDeployment,
    SecretExists,
    SecretInUse,
    SecretNotFound,
    TooManyFunctions,
    WrongNamespace,
)
from runtime.images import ImageResolver
from runtime.models import FunctionDeployment, omit_empty
from runtime.replicas import Replica, kill_now, probe, spawn_replica, stop_replica
from runtime.secrets import SecretStore, private_folder, sync_folder, validate_name
from runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)

MAX_BACKOFF = 10.0


@dataclass
class Function:
    """A deployed function: its spec, desired replica count and current replicas."""

    spec: FunctionDeployment
    function_dir: Path
    desired: int
    generation: int = 1
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    replicas: list[Replica] = field(default_factory=list)
    invocations: int = 0
    # slot -> (consecutive crashes, monotonic time before which it is not restarted)
    backoff: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.service

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "ready"]


#: What a deployment's constraint may name a node by (faas-netes maps constraints to a
#: nodeSelector; ``kubernetes.io/hostname`` is the node's own label there).
NODE_CONSTRAINTS = ("node", "kubernetes.io/hostname")


def place_replica(fn: Function, nodes: dict[str, Path]) -> str:
    """The node a new replica of ``fn`` runs on ("" when the runtime has no nodes).

    A ``node=NAME`` (or ``kubernetes.io/hostname=NAME``) constraint pins it; otherwise the
    replicas spread: the node with the fewest live replicas of the function, first by name.
    """
    if not nodes:
        return ""
    for c in fn.spec.constraints or []:
        key, sep, value = c.replace("==", "=").partition("=")
        if sep and key.strip() in NODE_CONSTRAINTS and value.strip() in nodes:
            return value.strip()
    count = dict.fromkeys(sorted(nodes), 0)
    for r in fn.replicas:
        if r.node in count and r.state != "stopping":
            count[r.node] += 1
    return min(count, key=lambda n: (count[n], n))


def node_env(node: str, router_socket: Path) -> dict[str, str]:
    """What a replica placed on ``node`` learns about it (the downward API's part)."""
    return {NODE_ENV: node, ROUTER_SOCKET_ENV: str(router_socket)}


class Provider:
    """Keeps every deployed function at its desired number of healthy replica processes.

    Parameters
    ----------
    settings:
        Runtime settings (state folder, limits, probe timing).
    """

    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        #: the replicas' TLS files (None: plain HTTP on loopback); TlsError here if unusable
        self.function_tls = settings.function_tls()
        self.namespace = settings.namespace
        self.images = ImageResolver(settings.stack, settings.platform_stack)
        self.secrets = SecretStore(settings.state_dir / "secrets")
        #: each function's secrets folder lives here (rebuilt at every start: functions do not
        #: outlive the runtime, secrets do)
        self._function_secrets = settings.state_dir / "function-secrets"
        self._functions: dict[str, Function] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the health loop."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self._function_secrets, ignore_errors=True)
        private_folder(self._function_secrets)
        self._client = httpx.AsyncClient(
            timeout=self.settings.health_timeout,
            trust_env=False,
            verify=self.settings.replica_verify(),
        )
        self._loop_task = asyncio.create_task(self._health_loop(), name="runtime-health")

    async def stop(self) -> None:
        """Stop the health loop and every replica; no process is left behind."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        async with self._lock:
            replicas = [r for f in self._functions.values() for r in f.replicas]
            self._functions.clear()
        await asyncio.gather(
            *(stop_replica(r, self.settings.stop_grace) for r in replicas), return_exceptions=True
        )
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for r in replicas:
            if r.alive():
                kill_now(r)
        if self._client is not None:
            await self._client.aclose()

    # ----------------------------------------------------------------- API
    def check_namespace(self, namespace: str | None) -> None:
        """Raise :class:`WrongNamespace` unless ``namespace`` is empty or the function namespace."""
        if namespace and namespace != self.namespace:
            raise WrongNamespace(namespace, self.namespace)

    def _validate(self, spec: FunctionDeployment) -> Path:
        validation.validate_name(spec.service)
        self.check_namespace(spec.namespace)
        validation.validate_labels(
            spec.labels or {}, spec.service, ce_limits=self.settings.ce_limits
        )
        return self.images.resolve(spec)

    def _check_secrets(self, spec: FunctionDeployment) -> None:
        """Every secret the deployment lists must exist (faas-netes refuses it the same way)."""
        missing = [s for s in spec.secrets or [] if not self.secrets.exists(s)]
        if missing:
            raise InvalidDeployment(
                spec.service,
                f"secret(s) not found: {', '.join(missing)}; create them first "
                "(faas-cli secret create NAME, or POST /system/secrets)",
            )

    def secrets_dir(self, name: str) -> Path:
        """The folder of function ``name``'s secrets (``FEDFAAS_SECRETS_DIR`` of its replicas)."""
        return self._function_secrets / name

    def _mount_secrets(self, fn: Function) -> None:
        sync_folder(self.secrets_dir(fn.name), list(fn.spec.secrets or []), self.secrets)

    async def deploy(self, spec: FunctionDeployment) -> None:
        """Create a function and start ``com.openfaas.scale.min`` replicas (default 1)."""
        function_dir = self._validate(spec)
        async with self._lock:
            if spec.service in self._functions:
                raise FunctionExists(spec.service)
            if self.settings.ce_limits and len(self._functions) >= self.settings.max_functions:
                raise TooManyFunctions(
                    f"OpenFaaS CE allows {self.settings.max_functions} functions; remove one first"
                )
            self._check_secrets(spec)
            fn = Function(spec, function_dir, validation.min_replicas(spec.labels or {}))
            self._mount_secrets(fn)
            self._functions[spec.service] = fn
            self._reconcile_slots(fn)
        log.info("deployed %s (%s, %d replicas)", spec.service, spec.image, fn.desired)

    async def update(self, spec: FunctionDeployment) -> None:
        """Replace a function's spec; new replicas start and the old ones stop once they are ready."""
        validation.validate_name(spec.service)
        if spec.service not in self._functions:
            raise FunctionNotFound(spec.service)
        function_dir = self._validate(spec)
        async with self._lock:
            fn = self._functions.get(spec.service)
            if fn is None:
                raise FunctionNotFound(spec.service)
            self._check_secrets(spec)
            labels = spec.labels or {}
            hi = validation.max_replicas(
                labels, ce_limits=self.settings.ce_limits, default_max=self.settings.max_replicas
            )
            fn.spec, fn.function_dir = spec, function_dir
            self._mount_secrets(fn)
            fn.desired = min(max(fn.desired, validation.min_replicas(labels)), hi)
            fn.generation += 1
            fn.backoff.clear()
            self._reconcile_slots(fn)
        log.info("updated %s to generation %d", spec.service, fn.generation)

    async def delete(self, name: str) -> None:
        """Remove a function at once (it is gone from the API) and stop its replicas."""
        async with self._lock:
            fn = self._functions.pop(name, None)
        if fn is None:
            raise FunctionNotFound(name)
        for r in fn.replicas:
            self._stop_later(r)
        shutil.rmtree(self.secrets_dir(name), ignore_errors=True)
        log.info("deleted %s", name)

    # ----------------------------------------------------------------- secrets
    def list_secrets(self) -> list[dict[str, str]]:
        """``[{"name", "namespace"}]``: names only, never values (as faas-netes lists them)."""
        return [{"name": n, "namespace": self.namespace} for n in self.secrets.names()]

    async def create_secret(self, name: str, value: bytes) -> None:
        """Create a secret; :class:`SecretExists` if it is there already."""
        validate_name(name)
        async with self._lock:
            if self.secrets.exists(name):
                raise SecretExists(name)
            self.secrets.write(name, value)
        log.info("secret %s created", name)

    async def update_secret(self, name: str, value: bytes) -> None:
        """Replace a secret's value, in the folder of every function that lists it too."""
        validate_name(name)
        async with self._lock:
            if not self.secrets.exists(name):
                raise SecretNotFound(name)
            self.secrets.write(name, value)
            users = [f for f in self._functions.values() if name in (f.spec.secrets or [])]
            for fn in users:
                self._mount_secrets(fn)
        log.info("secret %s updated (%d functions refreshed)", name, len(users))

    async def delete_secret(self, name: str) -> None:
        """Delete a secret; :class:`SecretInUse` (409) while a deployed function lists it."""
        validate_name(name)
        async with self._lock:
            if not self.secrets.exists(name):
                raise SecretNotFound(name)
            users = sorted(
                f.name for f in self._functions.values() if name in (f.spec.secrets or [])
            )
            if users:
                raise SecretInUse(name, users)
            self.secrets.delete(name)
        log.info("secret %s deleted", name)

    async def scale(self, name: str, replicas: int) -> int:
        """Set the desired count (clamped to ``[1, scale.max]``); returns the count applied."""
        async with self._lock:
            fn = self._get(name)
            target = validation.clamp_replicas(
                name,
                replicas,
                fn.spec.labels or {},
                ce_limits=self.settings.ce_limits,
                default_max=self.settings.max_replicas,
            )
            fn.desired = target
            self._reconcile_slots(fn)
        log.info("scaled %s to %d (asked %d)", name, target, replicas)
        return target

    def _get(self, name: str) -> Function:
        fn = self._functions.get(name)
        if fn is None:
            raise FunctionNotFound(name)
        return fn

    def exists(self, name: str) -> bool:
        return name in self._functions

    def status(self, name: str) -> dict[str, Any]:
        """FunctionStatus JSON of one function (zero numbers omitted, as Go's omitempty does)."""
        return self._status(self._get(name))

    def list_status(self) -> list[dict[str, Any]]:
        return [self._status(f) for f in self._functions.values()]

    def replicas(self, name: str) -> list[dict[str, object]]:
        """Per-replica facts (pid, port, state), a FedFaaS extension of the API."""
        return [r.describe() for r in self._get(name).replicas]

    def log_dir(self, name: str) -> Path:
        return self.settings.state_dir / "functions" / name

    def count_invocation(self, name: str) -> None:
        fn = self._functions.get(name)
        if fn is not None:
            fn.invocations += 1

    async def pick_replica(self, name: str, wait: float) -> Replica | None:
        """A random ready replica, waiting up to ``wait`` seconds for one; None if none is ready."""
        deadline = time.monotonic() + wait
        while True:
            fn = self._functions.get(name)
            if fn is None:
                return None
            ready = fn.ready()
            if ready:
                return random.choice(ready)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _status(self, fn: Function) -> dict[str, Any]:
        spec = fn.spec
        labels = {**(spec.labels or {}), "faas_function": fn.name}
        annotations = {"prometheus.io.scrape": "false", **(spec.annotations or {})}
        body: dict[str, Any] = omit_empty(
            {
                "name": fn.name,
                "image": spec.image,
                "namespace": self.namespace,
                "envProcess": spec.envProcess,
                "envVars": spec.envVars,
                "constraints": spec.constraints,
                "secrets": spec.secrets,
                "labels": labels,
                "annotations": annotations,
                "limits": spec.limits.dump() if spec.limits else None,
                "requests": spec.requests.dump() if spec.requests else None,
                "readOnlyRootFilesystem": spec.readOnlyRootFilesystem,
                "invocationCount": fn.invocations,
                "replicas": fn.desired,
                "availableReplicas": len(fn.ready()),
            }
        )
        body["createdAt"] = fn.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return body

    # ----------------------------------------------------------------- reconciliation
    def _stop_later(self, replica: Replica) -> None:
        replica.state = "stopping"
        task = asyncio.create_task(stop_replica(replica, self.settings.stop_grace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, fn: Function, slot: int) -> None:
        spec = fn.spec
        node = place_replica(fn, self.settings.nodes)
        env = dict(spec.envVars or {})
        if node:
            env.update(node_env(node, self.settings.nodes[node]))
        fn.replicas.append(
            spawn_replica(
                python=self.settings.python,
                function=fn.name,
                function_dir=fn.function_dir,
                slot=slot,
                generation=fn.generation,
                env_vars=env,
                env_process=spec.envProcess,
                log_dir=self.log_dir(fn.name),
                secrets_dir=self.secrets_dir(fn.name),
                node=node,
                watchdog=self.settings.watchdog,
                tls=self.function_tls,
            )
        )

    def _reconcile_slots(self, fn: Function) -> None:
        """Start missing replicas of the current generation, stop surplus and retired ones."""
        now = time.monotonic()
        for r in [r for r in fn.replicas if r.state != "stopping" and not r.alive()]:
            code = r.proc.returncode if r.proc is not None else None
            log.warning("%s (pid %s) exited with code %s", r.instance, r.pid, code)
            fn.replicas.remove(r)
            if r.generation == fn.generation:
                crashes = fn.backoff.get(r.slot, (0, 0.0))[0] + 1
                delay = 0.0 if crashes == 1 else min(MAX_BACKOFF, 0.5 * 2 ** (crashes - 2))
                fn.backoff[r.slot] = (crashes, now + delay)
        fn.replicas = [r for r in fn.replicas if r.state != "stopping"]
        current = {r.slot: r for r in fn.replicas if r.generation == fn.generation}
        for slot in range(fn.desired):
            if slot not in current and fn.backoff.get(slot, (0, 0.0))[1] <= now:
                self._spawn(fn, slot)
        for r in list(fn.replicas):
            surplus = r.generation == fn.generation and r.slot >= fn.desired
            if surplus:
                fn.replicas.remove(r)
                self._stop_later(r)
        # Rolling update: keep the old generation until the new one is fully ready.
        new_ready = sum(1 for r in fn.ready() if r.generation == fn.generation)
        if new_ready >= fn.desired:
            for r in [r for r in fn.replicas if r.generation != fn.generation]:
                fn.replicas.remove(r)
                self._stop_later(r)

    async def _probe_function(self, fn: Function) -> None:
        assert self._client is not None
        live = [r for r in fn.replicas if r.alive() and r.state != "stopping"]
        results = await asyncio.gather(*(probe(self._client, r) for r in live))
        now = time.monotonic()
        for r, ok in zip(live, results, strict=True):
            if r.state == "stopping":
                continue
            if ok:
                if r.state != "ready":
                    log.info("%s ready (pid %s)", r.instance, r.pid)
                r.state, r.failures, r.ever_ready = "ready", 0, True
                if r.generation == fn.generation:  # an old replica says nothing of a new crash loop
                    fn.backoff.pop(r.slot, None)
                continue
            r.failures += 1
            if r.ever_ready:
                if r.state == "ready":
                    log.warning("%s failed its health probe; unready", r.instance)
                r.state = "unready"
                restart = r.failures >= self.settings.failure_threshold
            else:
                restart = now - r.started_at > self.settings.startup_timeout
            if restart:
                log.warning("%s unhealthy (%d failed probes); replacing it", r.instance, r.failures)
                if r in fn.replicas:
                    fn.replicas.remove(r)
                self._stop_later(r)

    async def _health_loop(self) -> None:
        while True:
            try:
                # all at once: a hung replica of one function must not delay the others' probes
                fns = list(self._functions.values())
                outcomes = await asyncio.gather(
                    *(self._probe_function(f) for f in fns), return_exceptions=True
                )
                for fn, outcome in zip(fns, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        log.error("probing %s failed: %r", fn.name, outcome)
                async with self._lock:
                    for fn in self._functions.values():
                        self._reconcile_slots(fn)
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must survive anything one replica does
                log.exception("health loop iteration failed")
            await asyncio.sleep(self.settings.health_interval)
