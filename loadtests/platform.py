"""The whole platform under load: FL clients training, analysts querying, an operator watching
the control plane plan. ``bench/soak.py`` (``make soak``) runs it against ``fedfaas up --with
all`` (TLS, its default) and injects a fault in the middle; by hand, against such a platform::

    SOAK_SECRETS=.state/secrets SOAK_TOKENS=tokens.json SOAK_TRACKER=https://127.0.0.1:PORT \
    python -m locust -f loadtests/platform.py --headless -u 21 -r 21 -t 600s --host CONTROL_PLANE

Environment (paths only, never a token value): ``SOAK_JOB`` (a job created with one client
per :class:`Trainer`, ``c0``.. ``c{n-1}``), ``SOAK_TOKENS`` (a 0600 JSON file: client id -> its
bearer token, the job creation's ``tokens``), ``SOAK_SECRETS`` (the platform's secrets folder:
``analyst-token``), ``SOAK_CA_FILE`` (the platform's CA certificate, which every user verifies
the parts' ``https://`` addresses against; by default ``SOAK_SECRETS/tls/ca.crt``, where
``fedfaas up`` writes it; on ``fedfaas up --no-tls`` the addresses are ``http://`` and no CA is
used), ``SOAK_TRACKER`` (the request tracker's URL), ``SOAK_EVENTS`` (a JSON-lines
file where every failed request is appended with its wall-clock time, for the fault window),
``SOAK_ACKS`` (a JSON-lines file where every update a gateway acknowledged is appended:
:func:`loadtests.updates.ack_line`).

- :class:`Trainer` (weight 16): one FL client of the job. It asks the control plane for its
  assignment in the open round, and in a round it has not sent to yet, once the node gateway
  named holds the round's base model, uploads its own update of that round
  (:func:`loadtests.updates.update_of`, with its fixed sample count) there. A 202 is an
  acknowledgement, recorded; so is 409 ``duplicate_client`` after an attempt whose answer was
  lost (that upload was taken: the same bytes). Any other refusal is a failure.
- :class:`Analyst` (weight 4): FLStore queries on the job's recent rounds through the tracker
  (Multi-Krum, cosine, track, Oort), each synchronous.
- :class:`Operator` (weight 1): the control plane's nodes, the job's plan and view.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, between, events, task
from safetensors.numpy import save

from loadtests.platform_ca import ca_file, trust
from loadtests.updates import ack_line, update_of, weight_of

JOB = os.environ.get("SOAK_JOB", "soak")
TRACKER = os.environ.get("SOAK_TRACKER", "https://127.0.0.1:8092").rstrip("/")
_events_path = os.environ.get("SOAK_EVENTS", "")
_acks_path = os.environ.get("SOAK_ACKS", "")
_events_lock = threading.Lock()
_ids = itertools.count()


def _read(path: str) -> str:
    return Path(path).read_text().strip()


def _tokens() -> dict[str, str]:
    path = os.environ.get("SOAK_TOKENS", "")
    return json.loads(_read(path)) if path else {}


TOKENS = _tokens()
SECRETS = Path(os.environ.get("SOAK_SECRETS", ".state/secrets"))
ANALYST = _read(str(SECRETS / "analyst-token"))
CA_FILE = ca_file(os.environ.get("SOAK_CA_FILE", ""), SECRETS)


@events.request.add_listener
def _record_failure(
    request_type: str, name: str, exception: BaseException | None, **_: Any
) -> None:
    """Every failed request, with its time, into ``SOAK_EVENTS`` (the soak's fault window)."""
    if exception is None or not _events_path:
        return
    line = json.dumps({"t": time.time(), "name": name, "error": repr(exception)[:300]})
    with _events_lock, open(_events_path, "a") as f:
        f.write(line + "\n")


def _record_ack(client: str, rnd: int, how: str) -> None:
    """An update a gateway acknowledged, into ``SOAK_ACKS`` (the soak's loss count and model
    check read them)."""
    if _acks_path:
        with _events_lock, open(_acks_path, "a") as f:
            f.write(ack_line(client, rnd, how) + "\n")


def _latest(view: dict[str, Any]) -> int:
    """The newest round FLStore surely holds: the one before the last completed (0: none
    yet; a round is ingested just after its model is published)."""
    return int(view.get("completed") or 0) - 1


class Trainer(HttpUser):
    """One FL client of the job (see module docstring)."""

    weight = 16
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        trust(self.client, CA_FILE)
        self.cid = f"c{next(_ids)}"
        self.auth = {"Authorization": f"Bearer {TOKENS[self.cid]}"}
        self.sent = 0  # the last round this client's update landed in
        self.broke = 0  # a round whose last upload attempt got no answer (0: none)

    @task
    def train(self) -> None:
        """One call to the control plane: "am I in the open round, and where do I upload?"
        (409 while no round is open for this client); then the upload, once per round."""
        with self.client.get(
            f"/v1/jobs/{JOB}/assignment",
            params={"client": self.cid},
            headers=self.auth,
            name="control plane: assignment",
            catch_response=True,
        ) as r:
            if r.status_code == 409 and _error(r) == "client_not_selected":
                r.success()  # between rounds (aggregating), or not selected
                return
            if r.status_code != 200:
                r.failure(_why(r))
                return
            a = r.json()
        number = int(a["round"])
        if number > self.sent and self._base_model_there(str(a["gateway_url"]), number):
            self._upload(str(a["gateway_url"]).rstrip("/"), number)

    def _base_model_there(self, gateway: str, number: int) -> bool:
        """The node holds the model round ``number`` trains on (the one before): a client
        uploads only then, as the SDK does; before, the node would answer "not open yet"."""
        with self.client.get(
            f"{gateway.rstrip('/')}/v1/jobs/{JOB}",
            headers=self.auth,
            name="gateway: job status",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(_why(r))
                return False
            return int(r.json().get("version", -1)) >= number - 1

    def _upload(self, gateway: str, number: int) -> None:
        headers = {
            **self.auth,
            "X-Client-Id": self.cid,
            "X-Sample-Count": str(weight_of(self.cid)),
            # what Oort's scheduling reads (loss, duration_s), as a training client reports it
            "X-Client-Meta": json.dumps(
                {"loss": round(random.uniform(0.1, 2.0), 4), "duration_s": 1 + random.random()}
            ),
            "Content-Type": "application/octet-stream",
        }
        with self.client.post(
            f"{gateway}/v1/jobs/{JOB}/rounds/{number}/updates",
            data=save(update_of(self.cid, number)),
            headers=headers,
            name="gateway: upload",
            catch_response=True,
        ) as r:
            err = _error(r)
            if r.status_code == 202:
                r.success()
                _record_ack(self.cid, number, "202")
                self.sent = number
            elif r.status_code == 409 and err == "duplicate_client" and self.broke == number:
                r.success()  # the attempt whose answer was lost was taken: the same update
                _record_ack(self.cid, number, "duplicate")
                self.sent = number
            else:  # not taken (a duplicate without a lost answer is an error too)
                if r.status_code == 0:
                    self.broke = number  # sent, maybe taken: a duplicate answer will say
                r.failure(_why(r))


class Analyst(HttpUser):
    """An analyst asking FLStore about the job's recent rounds."""

    weight = 4
    wait_time = between(0.2, 1.0)

    def on_start(self) -> None:
        trust(self.client, CA_FILE)
        self.auth = {"Authorization": f"Bearer {ANALYST}"}
        self.round, self.seen = 0, 0.0

    def _query(self, name: str, body: dict[str, Any]) -> None:
        with self.client.post(
            f"{TRACKER}/v1/queries?wait=true",
            json={"job": JOB, **body},
            headers=self.auth,
            name=f"tracker: {name}",
            catch_response=True,
        ) as r:
            if r.status_code != 200:
                r.failure(_why(r))
            elif r.json().get("status") != "done":
                r.failure(f"status {r.json().get('status')}")

    @task
    def query(self) -> None:
        if time.monotonic() - self.seen > 10 or self.round < 1:  # the job's progress
            self.seen = time.monotonic()
            r = self.client.get(
                f"/v1/jobs/{JOB}", headers=self.auth, name="control plane: job view"
            )
            if r.status_code == 200:
                self.round = _latest(r.json())
        if self.round < 1:  # no round surely in FLStore yet
            return
        kind = random.choices(["multi-krum", "cosine", "track", "oort"], [3, 3, 2, 2])[0]
        if kind == "multi-krum":
            self._query(kind, {"workload": kind, "rounds": [self.round], "params": {"f": 1}})
        elif kind == "cosine":
            body = {"workload": "cosine-to-aggregate", "rounds": [self.round]}
            self._query(kind, {**body, "params": {"bottom_k": 1}})
        elif kind == "track":
            self._query(kind, {"workload": kind, "rounds": [self.round], "params": {"window": 5}})
        else:  # scheduling the round after the newest one FLStore holds
            self._query(kind, {"workload": kind, "params": {"round": self.round + 1, "k": 4}})


class Operator(HttpUser):
    """The operator watching the control plane place nodes and plan the job's hierarchy."""

    weight = 1
    wait_time = between(0.5, 1.5)

    def on_start(self) -> None:
        trust(self.client, CA_FILE)
        self.auth = {"Authorization": f"Bearer {ANALYST}"}

    @task
    def watch(self) -> None:
        self.client.get("/v1/nodes", headers=self.auth, name="control plane: nodes")
        with self.client.get(
            f"/v1/jobs/{JOB}/plan",
            headers=self.auth,
            name="control plane: plan",
            catch_response=True,
        ) as r:
            if r.status_code == 409:  # between two rounds: no open round, no plan
                r.success()


def _why(r: Any) -> str:
    """A failed answer as ``HTTP <status>: <body>`` (status 0: the connection's error)."""
    return f"HTTP {r.status_code}: {r.text[:200] if r.status_code else repr(r.error)[:200]}"


def _error(r: Any) -> str:
    try:
        body = r.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""
