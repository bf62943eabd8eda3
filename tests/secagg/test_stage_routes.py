"""The control plane's secure-aggregation stages (control_plane.secagg_stages) over two real
node gateways: a round of 3 clients (core.secagg's participants, every message through the
HTTP routes) whose root gateway unmasks and publishes exactly the dequantized sum; every stage
route and the root's unmask route refuse bad input with a 4xx JSON saying what is wrong (a
client late for the unmask stage of a round that ended is told the stage closed); a
round whose survivors send too few shares fails the job saying so; a job that asks for
secure aggregation with drop_flagged, or with parameters that cannot work, is refused."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

from client.secure import masked_initial_weights
from control_plane.coordinator import Coordinator
from control_plane.secagg_state import record_key
from core.auth import bearer
from core.secagg import masks, quantize
from core.secagg.config import SecAggConfig
from core.secagg.messages import Advert, b64, context, unb64, unmask_to_json
from core.secagg.participant import Participant
from tests.control import realgw
from tests.polling import wait_until
from tests.secagg.rounds import masked_job_body
from tests.tokens import control_client

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1", "c2"]
W0 = {"w": np.zeros(500, np.float32)}


@pytest.fixture()
def stack(redis_url: str, tmp_path: Any) -> Iterator[tuple[TestClient, dict[str, str], str]]:
    with realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs):
        coord = Coordinator(urls, mc=3.0, admin_token=secret)
        with control_client(coord, secret, tick_s=0.05) as api:
            yield api, urls, secret


def _create(api: TestClient, job: str, spec: dict[str, Any], **extra: Any) -> httpx.Response:
    return api.post("/v1/jobs", json=masked_job_body(job, CLIENTS, W0, spec, **extra))


class Round:
    """A job's round 1 driven through the routes, each client with its own token."""

    def __init__(
        self, api: TestClient, job: str, tokens: dict[str, str], cfg: SecAggConfig, secret: str
    ) -> None:
        self.api, self.job, self.tokens, self.cfg, self.secret = api, job, tokens, cfg, secret
        self.parts = {c: Participant(cfg, c, context(job, 1)) for c in CLIENTS}

    def call(
        self, method: str, stage: str, client: str, body: Any = None, **kw: Any
    ) -> httpx.Response:
        return self.api.request(
            method,
            f"/v1/jobs/{self.job}/rounds/1/secagg/{stage}",
            params={"client": client},
            json=body,
            headers=kw.pop("headers", bearer(self.tokens[client])),
            **kw,
        )

    def ok(self, method: str, stage: str, client: str, body: Any = None) -> Any:
        r = self.call(method, stage, client, body)
        assert r.status_code == 200, r.text
        return r.json()

    def through_upload(self, updates: dict[str, np.ndarray], samples: dict[str, int]) -> None:
        """Stages 1-3 for every client: adverts, envelopes, masked uploads to its gateway."""
        for c, p in self.parts.items():
            self.ok("POST", "advert", c, p.advertise().to_json())
        for c, p in self.parts.items():
            roster = self.ok("GET", "roster", c)["adverts"]
            envelopes = p.share_keys({o: Advert.from_json(a) for o, a in roster.items()})
            self.ok("POST", "envelopes", c, {o: b64(e) for o, e in envelopes.items()})
        for c, p in self.parts.items():
            inbox = self.ok("GET", "inbox", c)["envelopes"]
            sealed = {s: unb64(e, "envelope", limit=512) for s, e in inbox.items()}
            vec = p.masked_input(updates[c], samples[c], sealed)
            a = self.api.get(f"/v1/jobs/{self.job}/assignment", params={"client": c}).json()
            realgw.wait_round_open(a["gateway_url"], self.job, 1, self.secret)
            r = realgw.upload(
                a["gateway_url"], self.job, 1, c, self.tokens[c], {"masked": vec}, samples[c]
            )
            assert r.status_code == 202, r.text

    def unmask_message(self, client: str) -> dict[str, Any]:
        def request() -> Any:
            r = self.call("GET", "unmask", client)
            return r.json() if r.status_code == 200 else None

        req = wait_until(request, 60, "the round's masked sum on its root")
        return unmask_to_json(
            *self.parts[client].unmask(set(req["dropped"]), set(req["survivors"]))
        )


def _updates(seed: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    rng = np.random.default_rng(seed)
    ups = {c: rng.normal(0, 0.3, W0["w"].size).astype(np.float32) for c in CLIENTS}
    return ups, {c: int(rng.integers(10, 300)) for c in CLIENTS}


def _refused(r: httpx.Response, status: int, error: str, says: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and says in r.json()["detail"], r.text


def test_a_round_through_the_stage_routes_and_every_refusal_says_why(
    stack: tuple[TestClient, dict[str, str], str],
) -> None:
    api, urls, secret = stack
    spec = {"stage_timeout_s": 60.0}
    r = _create(api, "sa", spec, rounds=2)
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    rnd = Round(api, "sa", tokens, SecAggConfig.from_spec(spec), secret)
    advert = rnd.parts["c0"].advertise().to_json()
    # credentials first: none, another client's, no ?client=
    r = api.post("/v1/jobs/sa/rounds/1/secagg/advert", params={"client": "c0"}, json=advert,
                 headers={"Authorization": ""})  # fmt: skip
    assert r.status_code == 401
    assert rnd.call("POST", "advert", "c0", advert, headers=bearer(tokens["c1"])).status_code == 401
    r = api.post("/v1/jobs/sa/rounds/1/secagg/advert", json=advert)  # the admin, for nobody
    _refused(r, 422, "invalid_input", "?client=ID")
    # the round, the job, the client
    r = api.post("/v1/jobs/sa/rounds/2/secagg/advert", params={"client": "c0"}, json=advert)
    _refused(r, 409, "round_state", "not open")
    r = api.post("/v1/jobs/nope/rounds/1/secagg/advert", params={"client": "c0"}, json=advert)
    assert r.status_code == 404 and r.json()["error"] == "unknown_job"
    r = api.post("/v1/jobs/sa/rounds/1/secagg/advert", params={"client": "c9"}, json=advert)
    _refused(r, 409, "client_not_selected", "c9")
    # malformed messages, a body too large, messages out of turn
    _refused(rnd.call("POST", "advert", "c0", {"c_pk": "x"}), 422, "bad_secagg_message", "c_pk")
    bad = {**advert, "s_pk": "not base64!"}
    _refused(rnd.call("POST", "advert", "c0", bad), 422, "bad_secagg_message", "s_pk")
    big = rnd.call("POST", "advert", "c0", {"c_pk": "A" * (2 << 20)})
    assert big.status_code == 413 and big.json()["error"] == "body_too_large"
    _refused(rnd.call("GET", "roster", "c0"), 409, "stage_open", "0 of 3")
    _refused(rnd.call("POST", "envelopes", "c0", {}), 409, "stage_open", "roster")
    _refused(rnd.call("GET", "unmask", "c0"), 409, "stage_open", "not ready")
    _refused(rnd.call("POST", "unmask", "c0", {"s": {}, "b": {}}), 409, "stage_open", "unmask")
    rnd.ok("POST", "advert", "c0", advert)
    _refused(rnd.call("POST", "advert", "c0", advert), 422, "bad_secagg_message", "already")
    for c in ("c1", "c2"):
        rnd.ok("POST", "advert", c, rnd.parts[c].advertise().to_json())
    rnd.ok("GET", "roster", "c0")
    _refused(rnd.call("POST", "advert", "c0", advert), 409, "stage_closed", "advertise")
    _refused(rnd.call("POST", "envelopes", "c0", {"c9": "AAAA"}), 422, "bad_secagg_message",
             "one envelope to each")  # fmt: skip
    _refused(rnd.call("POST", "envelopes", "c0", [1]), 422, "bad_secagg_message", "envelopes")
    # the root's own unmask route: the admin's, and only while a sum waits
    root = urls[api.get("/v1/jobs/sa").json()["root"]]
    r = httpx.post(f"{root}/v1/jobs/sa/rounds/1/unmask", json={}, headers=bearer(tokens["c0"]))
    assert r.status_code == 401
    r = httpx.post(f"{root}/v1/jobs/sa/rounds/1/unmask", json={}, headers=bearer(secret))
    _refused(r, 409, "round_not_unmasking", "not waiting")

    # the rest of the round, through the routes
    for c, p in rnd.parts.items():
        roster = rnd.ok("GET", "roster", c)["adverts"]
        envelopes = p.share_keys({o: Advert.from_json(a) for o, a in roster.items()})
        rnd.ok("POST", "envelopes", c, {o: b64(e) for o, e in envelopes.items()})
    updates, samples = _updates(1)
    for c, p in rnd.parts.items():
        inbox = rnd.ok("GET", "inbox", c)["envelopes"]
        vec = p.masked_input(
            updates[c], samples[c], {s: unb64(e, "e", limit=512) for s, e in inbox.items()}
        )
        a = api.get("/v1/jobs/sa/assignment", params={"client": c}).json()
        realgw.wait_round_open(a["gateway_url"], "sa", 1, secret)
        up = realgw.upload(a["gateway_url"], "sa", 1, c, tokens[c], {"masked": vec}, samples[c])
        assert up.status_code == 202, up.text
    messages = {c: rnd.unmask_message(c) for c in CLIENTS}
    r = httpx.post(f"{root}/v1/jobs/sa/rounds/1/unmask", json={"adverts": []},
                   headers=bearer(secret))  # fmt: skip
    _refused(r, 422, "bad_unmask", "adverts")
    _refused(rnd.call("POST", "unmask", "c0", {"s": {"c1": [1]}, "b": {}}), 422,
             "bad_secagg_message", "[index, share]")  # fmt: skip
    for c in CLIENTS:
        rnd.ok("POST", "unmask", c, messages[c])
    view = wait_until(
        lambda: (v := api.get("/v1/jobs/sa").json())["completed"] == 1 and v, 60, "round 1"
    )
    assert not view["failed"], view
    # a client slow to unmask finds the stage closed once round 2 opened (what the SDK takes
    # as "unmasked without its shares"), not a wrong round; the other stages say round_state
    wait_until(lambda: (api.get("/v1/jobs/sa").json()["round"] or {}).get("number") == 2, 60,
               "round 2 opens")  # fmt: skip
    _refused(rnd.call("POST", "unmask", "c0", messages["c0"]), 409, "stage_closed", "ended")
    _refused(rnd.call("GET", "unmask", "c1"), 409, "stage_closed", "ended")
    _refused(rnd.call("POST", "advert", "c0", advert), 409, "round_state", "not open")
    model = httpx.get(f"{root}/v1/jobs/sa/model", headers=bearer(tokens["c0"]))
    got = load(model.content)["fedavg"]
    total = np.zeros(W0["w"].size + 1, np.uint32)
    for c in CLIENTS:
        masks.add(total, quantize.quantize(rnd.cfg, updates[c], samples[c]))
    np.testing.assert_array_equal(got, quantize.dequantize(rnd.cfg, total, len(CLIENTS)))
    # a job without secure aggregation has no stages, here or on its root
    realgw.create_job(api, W0, job="plain", rounds=1, goal=3, clients=CLIENTS)
    r = api.post("/v1/jobs/plain/rounds/1/secagg/advert", params={"client": "c0"}, json=advert)
    _refused(r, 409, "not_masked", "no secure aggregation")
    plain_root = urls[api.get("/v1/jobs/plain").json()["root"]]
    r = httpx.get(f"{plain_root}/v1/jobs/plain/rounds/1/unmask", headers=bearer(secret))
    _refused(r, 409, "not_masked", "nothing to unmask")


def test_too_few_shares_fail_the_job_saying_which_client_and_how_many(
    stack: tuple[TestClient, dict[str, str], str],
) -> None:
    """Only c0 sends its shares; after the stage's timeout the root finds 1 share of each
    seed where 2 are needed: the round is not published and the job fails saying so."""
    api, _, secret = stack
    spec = {"stage_timeout_s": 1.0}
    r = _create(api, "sb", spec)
    assert r.status_code == 201, r.text
    rnd = Round(api, "sb", r.json()["tokens"], SecAggConfig.from_spec(spec), secret)
    rnd.through_upload(*_updates(2))
    rnd.ok("POST", "unmask", "c0", rnd.unmask_message("c0"))
    view = wait_until(lambda: (v := api.get("/v1/jobs/sb").json())["failed"] and v, 60, "failed")
    assert "cannot unmask" in view["failed"] and "shares arrived, 2 are needed" in view["failed"]
    assert view["completed"] == 0


def test_a_job_deleted_mid_round_leaves_nothing_its_namesake_would_inherit(
    stack: tuple[TestClient, dict[str, str], str],
) -> None:
    """Job "sd" has its roster (3 adverts, the record in the store) when it is deleted: the
    record is gone with it, and a new job of the same name starts its round 1 with no adverts
    (before, the new job's clients were handed the deleted job's roster)."""
    api, _, secret = stack
    spec = {"stage_timeout_s": 60.0}
    coord = api.app.state.coordinator  # type: ignore[attr-defined]
    r = _create(api, "sd", spec)
    assert r.status_code == 201, r.text
    old = Round(api, "sd", r.json()["tokens"], SecAggConfig.from_spec(spec), secret)
    for c, p in old.parts.items():
        old.ok("POST", "advert", c, p.advertise().to_json())
    first = old.ok("GET", "roster", "c0")["adverts"]
    assert asyncio.run(coord.store.load_record(record_key("sd"))) is not None

    assert api.delete("/v1/jobs/sd").status_code == 204
    assert asyncio.run(coord.store.load_record(record_key("sd"))) is None

    r = _create(api, "sd", spec)
    assert r.status_code == 201, r.text
    new = Round(api, "sd", r.json()["tokens"], SecAggConfig.from_spec(spec), secret)
    _refused(new.call("GET", "roster", "c0"), 409, "stage_open", "0 of 3")
    for c, p in new.parts.items():
        new.ok("POST", "advert", c, p.advertise().to_json())
    roster = new.ok("GET", "roster", "c0")["adverts"]
    assert roster == {c: p.advertise().to_json() for c, p in new.parts.items()} != first


@pytest.mark.parametrize(
    ("spec", "extra", "says"),
    [
        ({}, {"drop_flagged": {"workload": "multi-krum"}}, "drop_flagged"),
        ({"bits": 40}, {}, "bits must be"),
    ],
)
def test_a_job_secure_aggregation_cannot_serve_is_refused_at_creation(
    stack: tuple[TestClient, dict[str, str], str],
    spec: dict[str, Any],
    extra: dict[str, Any],
    says: str,
) -> None:
    api, _, _ = stack
    if "bits" in spec:  # past the SDK's own check: the weights' metadata as a client may send it
        weights = masked_initial_weights(save(W0), {})
        n = int.from_bytes(weights[:8], "little")
        header = json.loads(weights[8 : 8 + n])
        header["__metadata__"]["fedfaas.secagg"] = json.dumps(spec)
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        weights = len(raw).to_bytes(8, "little") + raw + weights[8 + n :]
        body = {"job": "sc", "rounds": 1, "goal": 3, "clients": CLIENTS,
                "weights_b64": base64.b64encode(weights).decode()}  # fmt: skip
        r = api.post("/v1/jobs", json=body)
    else:
        r = _create(api, "sc", spec, **extra)
    _refused(r, 400, "bad_secure_aggregation", says)
    assert api.get("/v1/jobs/sc").status_code == 404
