"""``tests.k8s.api.send_again_while_busy``: the Kubernetes tier's waits read the API server for
minutes on a loaded 2-core machine, where a busy server answers a read with 429 (priority and
fairness), 500 "etcdserver: request timed out", 503 or 504 for a moment. Such an answer is sent
again, a read's 5xx only (a write that got a 5xx may have been done); a lasting one, or any other
status, comes back as it is."""

from __future__ import annotations

import httpx
import pytest

from tests.k8s.api import TRIES, send_again_while_busy


class _Server:
    """Answers with the given statuses in turn, the last one for ever; counts the sends."""

    def __init__(self, *statuses: int, headers: dict[str, str] | None = None) -> None:
        self.statuses = list(statuses)
        self.headers = headers or {}
        self.sent = 0

    def __call__(self) -> httpx.Response:
        status = self.statuses[min(self.sent, len(self.statuses) - 1)]
        self.sent += 1
        return httpx.Response(status, headers=self.headers, json={"code": status})


def _send(method: str, server: _Server) -> tuple[httpx.Response, list[float]]:
    waits: list[float] = []
    return send_again_while_busy(method, server, sleep=waits.append), waits


@pytest.mark.parametrize("busy", [429, 500, 502, 503, 504])
def test_a_read_the_busy_server_turned_away_is_sent_again_until_it_answers(busy: int) -> None:
    server = _Server(busy, busy, 200)
    r, waits = _send("GET", server)
    assert (r.status_code, server.sent, waits) == (200, 3, [0.25, 0.5])


def test_the_wait_is_what_retry_after_asks_at_most_five_seconds() -> None:
    r, waits = _send("GET", _Server(429, 429, 200, headers={"Retry-After": "2"}))
    assert r.status_code == 200 and waits == [2.0, 2.0]
    r, waits = _send("GET", _Server(503, 200, headers={"Retry-After": "60"}))
    assert r.status_code == 200 and waits == [5.0]
    r, waits = _send("GET", _Server(503, 200, headers={"Retry-After": "soon"}))
    assert r.status_code == 200 and waits == [0.25]


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE"])
def test_a_write_is_sent_again_after_429_only(method: str) -> None:
    server = _Server(429, 201)
    r, waits = _send(method, server)
    assert (r.status_code, server.sent, waits) == (201, 2, [0.25])
    server = _Server(500, 201)  # it may have been done: never sent twice
    r, waits = _send(method, server)
    assert (r.status_code, server.sent, waits) == (500, 1, [])


def test_a_lasting_busy_answer_comes_back_after_the_last_try() -> None:
    server = _Server(503)
    r, waits = _send("GET", server)
    assert r.status_code == 503 and server.sent == TRIES
    assert waits == [0.25 * 2**i for i in range(TRIES - 1)]


@pytest.mark.parametrize("status", [200, 201, 400, 401, 403, 404, 409, 422])
def test_any_other_answer_comes_back_at_once(status: int) -> None:
    for method in ("GET", "POST"):
        server = _Server(status, 200)
        r, waits = _send(method, server)
        assert (r.status_code, server.sent, waits) == (status, 1, [])
