"""The stages of a secure-aggregation round (SecAgg+, :mod:`core.secagg`) on the control plane.

A job created with secure aggregation (:mod:`control_plane.secagg`) runs, in each round, the
stages around its clients' masked uploads. Every route takes the client's own token with
``?client=ID`` (or the admin's), is read only after it, and answers bad input with a 4xx JSON
``{"error", "detail"}`` saying what is wrong:

* ``POST /v1/jobs/{job}/rounds/{r}/secagg/advert``: the client's advert
  (``{"c_pk", "s_pk", "b_commit"}``, :class:`core.secagg.messages.Advert`).
* ``GET  .../secagg/roster``: every advert of the round, once the advertise stage closed: when
  each selected client advertised, or ``stage_timeout_s`` after the first advert (409
  ``stage_open`` until then; the SDK asks again).
* ``POST .../secagg/envelopes``: ``{neighbour: envelope}``, the client's sealed shares.
* ``GET  .../secagg/inbox``: ``{"envelopes": {sender: envelope}}`` for the client, once the
  share-keys stage closed (every advertiser shared, or ``stage_timeout_s`` after the roster).
  The client then masks its update and uploads it to its node gateway as usual.
* ``GET  .../secagg/unmask``: ``{"dropped", "survivors"}`` once the job's root gateway holds
  the round's masked sum (it says whose vectors the sum holds: :mod:`gateway.unmask`).
* ``POST .../secagg/unmask``: the survivor's shares (``{"s", "b"}``).

Once the shares in hand rebuild every seed the unmasking needs (each checked against its
owner's advertised key or commitment: :meth:`core.secagg.coordinator.Coordinator.can_unmask`),
every survivor sent its shares, or ``stage_timeout_s`` after the unmask stage opened, the
control plane sends the root gateway the adverts, who shared and the shares: the root
unmasks and publishes the round. A round that cannot go on (fewer than 3 adverts, too few
vectors or shares, a wrong share) fails the job with a message that says why (the job's view,
``failed``), as a round short of its minimum does.

The stages' state is kept in the control plane's store with its jobs (Redis with ``--redis``:
one record per job, ``secagg:<job>``, the open round's adverts, envelopes, who masked and the
shares that came, :meth:`core.secagg.coordinator.Coordinator.to_state`), written before a
route that changed it answers: a message the client saw acknowledged survives a restart of
the control plane. A restarted control plane reads it back as it starts (:func:`resume`;
each message checked again) and the round goes on; the stage that was open then waits its
``stage_timeout_s`` again from that start, and an unmask stage that was open sends the root
its material once the shares in hand rebuild every seed (at once when they did before the
restart), unless the root published the round already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request

from control_plane.client_rounds import read_json
from control_plane.coordinator import Coordinator
from control_plane.errors import (
    ClientNotSelected,
    ClientRevoked,
    ControlPlaneError,
    GatewayError,
    InvalidInput,
    JobFailed,
    RoundStateError,
)
from control_plane.jobs import JobState
from control_plane.secagg_state import StageRound, record_key
from core.auth import Scope, require
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator as SecAggCoordinator
from core.secagg.coordinator import RoundFailed
from core.secagg.messages import (
    Advert,
    MessageError,
    b64,
    context,
    envelopes_from_json,
    unmask_from_json,
)

log = logging.getLogger(__name__)

#: the largest stage body read (envelopes for thousands of neighbours)
MAX_BODY = 1 << 20
PREFIX = "/v1/jobs/{job}/rounds/{number}/secagg"


class StageOpen(ControlPlaneError):
    """The stage the client asks about has not closed yet: ask again."""

    code = "stage_open"
    status = 409


class StageClosed(ControlPlaneError):
    """The stage the client sends to has closed: it counts as dropped from here on."""

    code = "stage_closed"
    status = 409


class NotInSum(StageClosed):
    """The round's masked sum holds no vector of the client asking to unmask: its update is in
    no model of this round (not "closed without it": the client must hear of it)."""

    code = "not_in_sum"


class BadStageMessage(ControlPlaneError):
    """A stage message that is malformed or does not fit the round; the detail says why."""

    code = "bad_secagg_message"
    status = 422


class NotMasked(ControlPlaneError):
    """The job has no secure aggregation."""

    code = "not_masked"
    status = 409


class Stages:
    """Every masked job's open round, by ``(job, round)``."""

    def __init__(self, coord: Coordinator, clock: Callable[[], float] = time.monotonic) -> None:
        self.coord, self.clock = coord, clock
        self.rounds: dict[tuple[str, int], StageRound] = {}
        self.loading = asyncio.Lock()

    async def round_of(
        self, name: str, number: int, client: str, *, unmasking: bool = False
    ) -> tuple[JobState, StageRound]:
        """The job and its round ``number``'s stages for ``client`` (read from the store, or
        made, on first use). ``unmasking``: the client asks for or sends its shares, and a
        round that ended already (published with the shares of others, while this client was
        slow) answers :class:`StageClosed`, as a stage that closed without it does."""
        job = self.coord.job(name)
        if not job.secagg:
            raise NotMasked(f"job {name!r} has no secure aggregation")
        if job.failed:
            raise JobFailed(name, job.failed)
        if client in job.revoked:
            raise ClientRevoked(name, client)
        rnd = job.current
        if rnd is None or rnd.number != number:
            now = "none" if rnd is None else str(rnd.number)
            if unmasking and 0 < number <= job.completed:
                raise StageClosed(
                    f"round {number} of {name!r} ended without this client's shares "
                    f"(its round: {now}); the unmask stage closed"
                )
            raise RoundStateError(f"round {number} of {name!r} is not open; its round: {now}")
        if client not in rnd.selected:
            raise ClientNotSelected(name, client, number)
        for key in [
            k
            for k in self.rounds
            if k[0] not in self.coord.jobs or (k[0] == name and k[1] < number)
        ]:
            self._forget(key)  # earlier rounds, and the rounds of deleted jobs
        return job, await self._held(job, number)

    async def _held(self, job: JobState, number: int) -> StageRound:
        """Round ``number``'s stages, read from the store or made on first use."""
        key = (job.spec.name, number)
        st = self.rounds.get(key)
        if st is not None and st.salt != job.salt:  # a deleted job's round, its name reused
            self._forget(key)
            st = None
        if st is None:
            async with self.loading:
                st = self.rounds.get(key)
                if st is None:
                    st = self.rounds[key] = await self._load(job, number)
        return st

    async def resume(self) -> None:
        """Read back every masked job's open round at the start: an unmask stage whose
        material was not sent is sent without waiting for a client's call (its survivors may
        all have answered before the restart)."""
        for job in list(self.coord.jobs.values()):
            if job.secagg and job.current is not None and not job.failed:
                try:
                    await self._held(job, job.current.number)
                except ControlPlaneError as exc:
                    log.warning("job %s: its secure round not read back: %s", job.spec.name, exc)

    async def _load(self, job: JobState, number: int) -> StageRound:
        """Round ``number``'s stages as the store kept them, or new ones; a kept state that
        does not hold fails the job saying why."""
        name = job.spec.name
        cfg = SecAggConfig.from_spec(job.secagg)
        rec = await self.coord.store.load_record(record_key(name))
        if not rec or rec.get("salt") != job.salt or rec.get("round") != number:
            return StageRound(cfg, SecAggCoordinator(cfg, context(name, number)), job.salt)
        try:
            st = StageRound.from_record(cfg, context(name, number), rec, self.clock())
        except (MessageError, RoundFailed, KeyError, TypeError, ValueError) as exc:
            await self.fail(job, f"round {number}: its kept secure-aggregation state: {exc}")
            raise JobFailed(name, job.failed) from None
        log.info(
            "job %s round %d: secure-aggregation stages read back (%d adverts, %d shared, "
            "%d masked, %d shares)", name, number, len(st.server.adverts),
            len(st.server.shared), len(st.server.masked), len(st.messages),
        )  # fmt: skip
        if st.unmask_at is not None and not st.sent:
            st.sender = asyncio.create_task(self._resend(job, st, number), name=f"unmask:{number}")
        return st

    async def _resend(self, job: JobState, st: StageRound, number: int) -> None:
        """A read-back unmask stage's sender: none when the root published the round already
        (the material went before the restart, its record did not)."""
        gw = self.coord.clients.get(job.root)
        with contextlib.suppress(GatewayError):
            if (
                gw is not None
                and (await gw.unmask_state(job.spec.name, number)).get("state") == "published"
            ):
                st.enough.set()
                st.sent = st.dirty = True
                await self.save(job, number, st)
                return
        await self._send(job, st, number)

    async def save(self, job: JobState, number: int, st: StageRound) -> None:
        """Write ``st`` to the store if it changed (one write at a time, each of the state
        as it is then: a later write never holds less)."""
        async with st.saving:
            if not st.dirty:
                return
            st.dirty = False
            await self.coord.store.save_record(record_key(job.spec.name), st.to_record(number))

    def _forget(self, key: tuple[str, int]) -> None:
        st = self.rounds.pop(key)
        if st.sender is not None:
            st.sender.cancel()

    def expected(self, job: JobState) -> set[str]:
        """The clients the open round may still hear from."""
        rnd = job.current
        assert rnd is not None
        return set(rnd.selected) - set(job.revoked) - set(rnd.failures)

    def _timed_out(self, since: float | None, st: StageRound) -> bool:
        return since is not None and self.clock() - since >= st.cfg.stage_timeout_s

    async def fail(self, job: JobState, why: str) -> None:
        """Fail ``job`` with ``why`` (its round cannot be unmasked), once."""
        async with self.coord.job_lock(job.spec.name):
            if not job.failed and self.coord.still_current(job):
                await self.coord._fail(job, why)
                await self.coord._save(job)

    # -- stage 1 -----------------------------------------------------------------------------
    def advert(self, job: JobState, st: StageRound, client: str, body: Any) -> dict[str, Any]:
        if st.roster_at is not None:
            raise StageClosed(f"the advertise stage of round {st.server.context!r} closed")
        try:
            st.server.add_advert(client, Advert.from_json(body))
        except MessageError as exc:
            raise BadStageMessage(str(exc)) from None
        if st.first_advert is None:
            st.first_advert = self.clock()
        st.dirty = True
        return {"stage": "advertise", "advertised": len(st.server.adverts)}

    async def roster(self, job: JobState, st: StageRound, client: str) -> dict[str, Any]:
        if st.roster_at is None:
            everyone = self.expected(job) <= set(st.server.adverts)
            if not everyone and not self._timed_out(st.first_advert, st):
                raise StageOpen(
                    f"{len(st.server.adverts)} of {len(self.expected(job))} clients advertised"
                )
            try:
                st.server.close_adverts()
            except RoundFailed as exc:
                await self.fail(job, f"round {job.current and job.current.number}: {exc}")
                raise JobFailed(job.spec.name, job.failed) from None
            st.roster_at = self.clock()
            st.dirty = True
        if client not in st.server.adverts:
            raise StageClosed(f"{client} did not advertise before the stage closed")
        return {
            "adverts": {c: a.to_json() for c, a in st.server.adverts.items()},
            "config": st.cfg.to_spec(),
        }

    # -- stage 2 -----------------------------------------------------------------------------
    def envelopes(self, st: StageRound, client: str, body: Any) -> dict[str, Any]:
        if st.roster_at is None:
            raise StageOpen("the advertise stage has not closed: ask for the roster first")
        if st.shares_closed:
            raise StageClosed("the share-keys stage closed")
        try:
            limit = len(st.server.neighbours.get(client, ()))
            st.server.add_envelopes(client, envelopes_from_json(body, limit))
        except MessageError as exc:
            raise BadStageMessage(str(exc)) from None
        st.dirty = True
        return {"stage": "share-keys", "shared": len(st.server.shared)}

    def inbox(self, st: StageRound, client: str) -> dict[str, Any]:
        if not st.shares_closed:
            if st.roster_at is None:
                raise StageOpen("the advertise stage has not closed")
            if set(st.server.adverts) != st.server.shared and not self._timed_out(st.roster_at, st):
                raise StageOpen(f"{len(st.server.shared)} of {len(st.server.adverts)} shared")
            st.shares_closed = st.dirty = True
        try:
            inbox = st.server.inbox(client)
        except MessageError as exc:
            raise StageClosed(str(exc)) from None
        return {"envelopes": {s: b64(e) for s, e in inbox.items()}}

    # -- stage 4 -----------------------------------------------------------------------------
    async def unmask_request(self, job: JobState, st: StageRound, client: str) -> dict[str, Any]:
        if st.unmask_at is None:
            await self._ask_root(job, st)
        dropped, survivors = st.server.unmask_request()
        if client not in survivors:
            raise NotInSum(f"the round's masked sum holds no vector of {client}")
        return {"dropped": sorted(dropped), "survivors": sorted(survivors)}

    async def _ask_root(self, job: JobState, st: StageRound) -> None:
        """Learn from the root gateway whose vectors the sum holds; start the sender."""
        assert job.current is not None
        number = job.current.number
        gw = self.coord.clients.get(job.root)
        if gw is None:
            raise RoundStateError(f"the job's root node {job.root} is not known here")
        try:
            state = await gw.unmask_state(job.spec.name, number)
        except GatewayError as exc:
            raise StageOpen(f"the root gateway did not answer: {exc}") from None
        if state.get("state") == "failed":
            await self.fail(job, str(state.get("failed")))
            raise JobFailed(job.spec.name, job.failed)
        if state.get("state") != "waiting":
            raise StageOpen(f"round {number}'s masked sum is not ready ({state.get('state')})")
        if st.unmask_at is not None:  # another request got here first
            return
        st.shares_closed = True
        try:
            for c in state["masked"]:
                st.server.add_masked(c)
            st.server.unmask_request()
        except (MessageError, RoundFailed) as exc:
            await self.fail(job, f"round {number}: {exc}")
            raise JobFailed(job.spec.name, job.failed) from None
        st.unmask_at = self.clock()
        st.dirty = True
        st.sender = asyncio.create_task(self._send(job, st, number), name=f"unmask:{number}")

    def unmask(self, st: StageRound, client: str, body: Any) -> dict[str, Any]:
        if st.unmask_at is None:
            raise StageOpen("the unmask stage has not opened: ask for the unmask request first")
        if st.enough.is_set() and client not in st.messages:
            raise StageClosed("the unmask stage closed")
        try:
            s, b = unmask_from_json(body, len(st.server.adverts))
            st.server.add_unmask(client, s, b)
        except MessageError as exc:
            raise BadStageMessage(str(exc)) from None
        st.messages[client] = body
        st.dirty = True
        # eager, as the folds are: the material is sent once it rebuilds every seed, without
        # waiting out the stage for survivors whose shares would add nothing
        if set(st.messages) >= st.server.masked or st.server.can_unmask():
            st.enough.set()
        return {"stage": "unmask", "answered": len(st.messages)}

    async def _send(self, job: JobState, st: StageRound, number: int) -> None:
        """Once the shares rebuild every seed, every survivor answered or the stage timed out:
        the material to the root."""
        with_timeout = asyncio.wait_for(st.enough.wait(), st.cfg.stage_timeout_s)
        try:
            await with_timeout
        except TimeoutError:
            log.warning(
                "job %s round %d: %d of %d survivors sent their shares; unmasking with those",
                job.spec.name,
                number,
                len(st.messages),
                len(st.server.masked),
            )
        st.enough.set()  # later shares are refused: the material is fixed
        material = {
            "adverts": {c: a.to_json() for c, a in st.server.adverts.items()},
            "shared": sorted(st.server.shared),
            "shares": dict(st.messages),
        }
        for attempt in range(5):
            try:
                why = await self.coord.clients[job.root].unmask(job.spec.name, number, material)
                break
            except (GatewayError, KeyError) as exc:
                log.warning(
                    "job %s round %d: unmask try %d: %s", job.spec.name, number, attempt, exc
                )
                await asyncio.sleep(1.0 + attempt)
        else:
            why = f"round {number}: the root gateway {job.root} took no unmask shares"
        st.sent = st.dirty = True
        await self.save(job, number, st)
        if why is not None:
            await self.fail(job, why)


def _client_of(request: Request, scope: Scope) -> str:
    """The ``?client=`` a stage route acts for (a client token was checked against it)."""
    client = request.query_params.get("client")
    if not client:
        raise InvalidInput(f"?client=ID names the client (the {scope} token acts for it)")
    return client


ClientScope = Annotated[Scope, Depends(require(Scope.CLIENT))]


async def resume(app: FastAPI) -> None:
    """At the app's start, once its coordinator loaded the jobs: :meth:`Stages.resume`."""
    await stages_of(app).resume()


def _stages(request: Request) -> Stages:
    return stages_of(request.app)


def stages_of(app: FastAPI) -> Stages:
    """The app's stages, over its coordinator (made on first use: the coordinator is made at
    the app's start)."""
    state = app.state
    coord: Coordinator = state.coordinator
    stages: Stages | None = getattr(state, "secagg_stages", None)
    if stages is None or stages.coord is not coord:
        stages = state.secagg_stages = Stages(coord)
    return stages


def _route(step: Step, reads_body: bool) -> Callable[..., Awaitable[Any]]:
    """A route for ``step``: the client's token checked (first: no body is read before it),
    its ``?client=``, the job's round, then (``reads_body``) the JSON body."""

    async def route(scope: ClientScope, job: str, number: int, request: Request) -> Any:
        client = _client_of(request, scope)
        stages = _stages(request)
        j, st = await stages.round_of(job, number, client, unmasking=step in UNMASKING)
        body = await read_json(request, MAX_BODY) if reads_body else None
        try:
            return await step(stages, j, st, client, body)
        finally:  # what the step took is kept before the client hears of it
            await stages.save(j, number, st)

    route.__doc__ = step.__doc__
    return route


Step = Callable[[Stages, JobState, StageRound, str, Any], Awaitable[dict[str, Any]]]


async def _advert(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 1: the client's advert."""
    return s.advert(job, st, client, body)


async def _roster(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 1 closed: every advert of the round."""
    return await s.roster(job, st, client)


async def _envelopes(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 2: the client's sealed shares, one envelope per neighbour."""
    return s.envelopes(st, client, body)


async def _inbox(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 2 closed: the envelopes for the client."""
    return s.inbox(st, client)


async def _unmask_request(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 4 opened: who dropped and who survived."""
    return await s.unmask_request(job, st, client)


async def _unmask(s: Stages, job: JobState, st: StageRound, client: str, body: Any) -> Any:
    """Stage 4: the survivor's shares."""
    return s.unmask(st, client, body)


#: path under :data:`PREFIX`, method, step, whether it reads a body
ROUTES: tuple[tuple[str, str, Step, bool], ...] = (
    ("/advert", "POST", _advert, True),
    ("/roster", "GET", _roster, False),
    ("/envelopes", "POST", _envelopes, True),
    ("/inbox", "GET", _inbox, False),
    ("/unmask", "GET", _unmask_request, False),
    ("/unmask", "POST", _unmask, True),
)


#: the steps of stage 4: a client late for them finds the stage closed, not a wrong round
UNMASKING = frozenset({_unmask_request, _unmask})


def add_routes(app: FastAPI) -> None:
    """Serve the stages' routes on the control plane's ``app``."""
    for path, method, step, reads_body in ROUTES:
        app.add_api_route(PREFIX + path, _route(step, reads_body), methods=[method])
