"""A secure round's stages survive a control plane that is SIGKILLed between them.

The control plane runs as its own process (``python -m control_plane``) with its state in
Redis, over two real node gateways. Round 1 of a job with secure aggregation: every client
advertises and reads the roster, three of five send their envelopes, and the control plane
is killed (SIGKILL) and started again; the other two send theirs, every client reads its
inbox (the first three's envelopes in it) and uploads its masked vector; each asks for the
unmask request and two send their shares; the control plane is killed and started again; the
last three send theirs. The root publishes exactly the dequantized sum of the clients'
quantized updates. A message sent before a kill is refused as a repeat after it: the state
read back is the one that was acknowledged.

Beside it, without processes: :meth:`Coordinator.to_state` through JSON and back at every
stage gives a round that unmasks to the same exact sum.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from control_plane.settings import ControlPlaneSettings
from core.auth import bearer
from core.secagg import masks, quantize
from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator
from core.secagg.messages import Advert, b64, context, unb64, unmask_from_json, unmask_to_json
from core.secagg.participant import Participant
from core.services import free_port
from tests.control import realgw
from tests.dataplane.peerproxy import PASS, REFUSE, PeerProxy
from tests.polling import wait_until
from tests.secagg.rounds import D, masked_job_body

CLIENTS = [f"c{i}" for i in range(5)]
SPEC = {"stage_timeout_s": 120.0, "neighbours": 4}
CFG = SecAggConfig.from_spec(SPEC)


def _updates(seed: int, size: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    rng = np.random.default_rng(seed)
    ups = {c: rng.normal(0, 0.3, size).astype(np.float32) for c in CLIENTS}
    return ups, {c: int(rng.integers(10, 300)) for c in CLIENTS}


def _exact(updates: dict[str, np.ndarray], samples: dict[str, int]) -> np.ndarray:
    total = np.zeros(next(iter(updates.values())).size + 1, np.uint32)
    for c in updates:
        masks.add(total, quantize.quantize(CFG, updates[c], samples[c]))
    return quantize.dequantize(CFG, total, len(updates))


def _again(coord: Coordinator) -> Coordinator:
    """``coord`` through its stored form, as a restarted control plane reads it."""
    return Coordinator.from_state(CFG, coord.context, json.loads(json.dumps(coord.to_state())))


def test_the_server_state_through_json_at_every_stage_unmasks_the_same_sum() -> None:
    ctx = context("kept", 1)
    parts = {c: Participant(CFG, c, ctx) for c in CLIENTS}
    server = _again(Coordinator(CFG, ctx))
    for c, p in parts.items():
        server.add_advert(c, Advert.from_json(p.advertise().to_json()))
        server = _again(server)
    roster = server.close_adverts()
    server = _again(server)
    for c in CLIENTS:
        server.add_envelopes(c, parts[c].share_keys(roster))
        server = _again(server)
    updates, samples = _updates(3, D)
    total = np.zeros(D + 1, np.uint32)
    for c in CLIENTS:
        masks.add(total, parts[c].masked_input(updates[c], samples[c], server.inbox(c)))
        server.add_masked(c)
        server = _again(server)
    dropped, survivors = server.unmask_request()
    for c in sorted(survivors):
        message = unmask_to_json(*parts[c].unmask(dropped, survivors))
        server.add_unmask(c, *unmask_from_json(message, len(CLIENTS)))
        server = _again(server)
    with pytest.raises(ValueError, match="already sent its shares"):  # the shares were kept
        server.add_unmask("c0", *unmask_from_json(message, len(CLIENTS)))
    np.testing.assert_array_equal(server.unmask(total), _exact(updates, samples))


class ControlPlaneProcess:
    """``python -m control_plane`` on a fixed port with its state in Redis."""

    def __init__(self, settings: ControlPlaneSettings, log: Path) -> None:
        self.settings, self.log = settings, log
        self.url = f"http://127.0.0.1:{settings.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.settings.to_argv(), stdout=out, stderr=subprocess.STDOUT, cwd=realgw.ROOT
            )
        proc = self.proc

        def up() -> bool:
            assert proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, "the control plane's /healthz")

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


UNMASK = r"/rounds/\d+/unmask$"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@dataclass
class Platform:
    cp: ControlPlaneProcess
    secret: str
    urls: dict[str, str]  # the gateways' by node
    #: the relays the control plane reaches each gateway through, by node: their mode
    #: applies to its unmask calls (the state asked for and the material sent)
    relays: dict[str, PeerProxy]


@pytest.fixture()
def platform(redis_url: Any, tmp_path: Path) -> Iterator[Platform]:
    """Two real gateways and a control plane process over them."""
    with (
        realgw.real_gateways(redis_url, tmp_path) as (urls, secret, procs),
        PeerProxy(_port(urls["n1"]), pattern=UNMASK) as n1,
        PeerProxy(_port(urls["n2"]), pattern=UNMASK) as n2,
    ):
        relays = {"n1": n1, "n2": n2}
        settings = ControlPlaneSettings(
            port=free_port(),
            gateways=",".join(f"{n}={r.url}" for n, r in relays.items()),
            redis_url=str(redis_url),
            redis_credentials_file=redis_url.credentials_file("control-plane"),
            admin_token_file=tmp_path / "secret",
            tick_s=0.1,
        )
        cp = ControlPlaneProcess(settings, tmp_path / "control-plane.log")
        cp.start()
        try:
            yield Platform(cp, secret, urls, relays)
        finally:
            cp.stop()


class Clients:
    """The round's clients, each with its token, over HTTP to the control plane."""

    def __init__(self, cp: ControlPlaneProcess, job: str, tokens: dict[str, str]) -> None:
        self.cp, self.job, self.tokens = cp, job, tokens
        self.parts = {c: Participant(CFG, c, context(job, 1)) for c in CLIENTS}

    def call(self, method: str, stage: str, client: str, body: Any = None) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.cp.url}/v1/jobs/{self.job}/rounds/1/secagg/{stage}",
            params={"client": client},
            json=body,
            headers=bearer(self.tokens[client]),
            timeout=60,
        )

    def ok(self, method: str, stage: str, client: str, body: Any = None) -> Any:
        r = self.call(method, stage, client, body)
        assert r.status_code == 200, r.text
        return r.json()

    def share(self, client: str, message: Any) -> bool:
        """``client``'s unmask shares sent: True when taken, False when the stage had already
        closed because the shares in hand rebuilt every seed (409 ``stage_closed``)."""
        r = self.call("POST", "unmask", client, message)
        if r.status_code == 409 and r.json()["error"] == "stage_closed":
            return False
        assert r.status_code == 200, r.text
        return True

    def refused(self, method: str, stage: str, client: str, body: Any, says: str) -> None:
        r = self.call(method, stage, client, body)
        assert r.status_code == 422 and says in r.json()["detail"], r.text


def _create(p: Platform, job: str) -> Clients:
    body = masked_job_body(job, CLIENTS, {"w": np.zeros(600, np.float32)}, SPEC)
    r = httpx.post(f"{p.cp.url}/v1/jobs", json=body, headers=bearer(p.secret), timeout=60)
    assert r.status_code == 201, r.text
    return Clients(p.cp, job, r.json()["tokens"])


def _upload(p: Platform, run: Clients, seed: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Every client's inbox read and its masked vector uploaded to its gateway."""
    updates, samples = _updates(seed, 600)
    for c, part in run.parts.items():
        inbox = run.ok("GET", "inbox", c)["envelopes"]
        assert len(inbox) == CFG.degree(len(CLIENTS))  # every neighbour's
        vec = part.masked_input(
            updates[c], samples[c], {s: unb64(e, "e", limit=512) for s, e in inbox.items()}
        )
        a = httpx.get(f"{p.cp.url}/v1/jobs/{run.job}/assignment", params={"client": c},
                      headers=bearer(p.secret))  # fmt: skip
        assert a.status_code == 200, a.text
        realgw.wait_round_open(a.json()["gateway_url"], run.job, 1, p.secret)
        up = realgw.upload(
            a.json()["gateway_url"], run.job, 1, c, run.tokens[c], {"masked": vec}, samples[c]
        )
        assert up.status_code == 202, up.text
    return updates, samples


def _unmask_messages(run: Clients) -> dict[str, Any]:
    """Each client's unmask request (every client survived) and its shares, as JSON."""

    def request(client: str) -> Any:
        r = run.call("GET", "unmask", client)
        return r.json() if r.status_code == 200 else None

    messages = {}
    for c, part in run.parts.items():
        req = wait_until(lambda c=c: request(c), 60, "the round's masked sum on its root")
        assert req["survivors"] == CLIENTS and req["dropped"] == []
        messages[c] = unmask_to_json(*part.unmask(set(), set(CLIENTS)))
    return messages


def _published_exact(p: Platform, run: Clients, updates: Any, samples: Any) -> None:
    def done() -> Any:
        v = httpx.get(f"{p.cp.url}/v1/jobs/{run.job}", headers=bearer(p.secret), timeout=30)
        assert not v.json().get("failed"), v.json()
        return v.json() if v.json()["completed"] == 1 else None

    view = wait_until(done, 120, "round 1 published")
    model = httpx.get(f"{p.urls[view['root']]}/v1/jobs/{run.job}/model",
                      headers=bearer(run.tokens["c0"]), timeout=30)  # fmt: skip
    assert model.status_code == 200, model.text
    np.testing.assert_array_equal(load(model.content)["fedavg"], _exact(updates, samples))


def test_a_round_killed_after_the_roster_and_in_the_unmask_stage_completes_exact(
    platform: Platform,
) -> None:
    p = platform
    run = _create(p, "kept")
    for c, part in run.parts.items():
        run.ok("POST", "advert", c, part.advertise().to_json())
    envelopes = {}
    for c, part in run.parts.items():
        roster = run.ok("GET", "roster", c)["adverts"]
        sealed = part.share_keys({o: Advert.from_json(a) for o, a in roster.items()})
        envelopes[c] = {o: b64(e) for o, e in sealed.items()}
    for c in CLIENTS[:3]:
        run.ok("POST", "envelopes", c, envelopes[c])

    p.cp.kill()  # after the roster, three of five envelopes in
    p.cp.start()
    run.refused("POST", "envelopes", "c0", envelopes["c0"], "already shared")
    for c in CLIENTS[3:]:
        run.ok("POST", "envelopes", c, envelopes[c])
    updates, samples = _upload(p, run, 7)  # each inbox has the envelopes of both sittings
    messages = _unmask_messages(run)
    for c in CLIENTS[:2]:
        run.ok("POST", "unmask", c, messages[c])

    p.cp.kill()  # in the unmask stage, two of five shares in
    p.cp.start()
    run.refused("POST", "unmask", "c1", messages["c1"], "already sent its shares")
    taken = [run.share(c, messages[c]) for c in CLIENTS[2:]]
    # the restarted control plane takes shares until they rebuild every seed, then closes
    assert taken[0] and taken == sorted(taken, reverse=True), taken
    _published_exact(p, run, updates, samples)


def test_every_share_in_but_not_sent_to_the_root_is_sent_after_a_restart(
    platform: Platform,
) -> None:
    """The relay in front of the root gateway refuses the control plane's unmask calls while
    the last shares come, so the material is not sent on; the control plane is killed, the
    relay passes again, the control plane is started: no client calls any more, and the
    round is published, exact (the restart reads the stage back and sends its material)."""
    p = platform
    run = _create(p, "resent")
    for c, part in run.parts.items():
        run.ok("POST", "advert", c, part.advertise().to_json())
    for c, part in run.parts.items():
        roster = run.ok("GET", "roster", c)["adverts"]
        sealed = part.share_keys({o: Advert.from_json(a) for o, a in roster.items()})
        run.ok("POST", "envelopes", c, {o: b64(e) for o, e in sealed.items()})
    updates, samples = _upload(p, run, 8)
    messages = _unmask_messages(run)
    view = httpx.get(f"{p.cp.url}/v1/jobs/resent", headers=bearer(p.secret), timeout=30).json()
    relay = p.relays[view["root"]]
    relay.set(REFUSE)
    taken = [run.share(c, messages[c]) for c in CLIENTS]
    assert taken[0] and taken == sorted(taken, reverse=True), taken
    wait_until(lambda: relay.outcomes.get(REFUSE), 30, "the material refused on its way")
    p.cp.kill()
    relay.set(PASS)
    p.cp.start()
    _published_exact(p, run, updates, samples)
