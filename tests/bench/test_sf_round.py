"""The SF round (bench.harness.sf_round) on real processes: clients, leaf servers and a top on
loopback ports talking real HTTP. The global model it serves is the exact weighted FedAvg of
what the clients sent; every route but the health check needs the token, before any body is
read; bad input gets a 4xx JSON error; a round the memory guard stops is a 'killed' record."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.harness import round_clients as rc
from bench.harness import sf_round, sf_servers
from core import fedavg, wire

LAYOUT = rc.scaled_layout(rc.resnet18_layout(), 1_000_000)


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fb-sf-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _leftovers() -> list[str]:
    return glob.glob(f"/dev/shm/fedfaas-bench-*{os.getpid()}-sf*")


def test_leaves_take_fanout_clients_each_and_alternate_between_servers() -> None:
    leaves = sf_servers.plan_leaves(5, 2, 2)
    assert [(leaf.id, leaf.server, leaf.clients) for leaf in leaves] == [
        (0, 0, (0, 1)),
        (1, 1, (2, 3)),
        (2, 0, (4,)),
    ]
    with pytest.raises(ValueError):
        sf_servers.plan_leaves(0, 2, 2)


def test_a_token_file_others_can_read_is_refused(work: Path) -> None:
    path = work / "t"
    path.write_text("secret")
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="want 0600"):
        sf_servers.read_token(path)
    path.chmod(0o600)
    assert sf_servers.read_token(path) == "secret"


@pytest.mark.integration
def test_the_served_global_is_the_weighted_fedavg_of_what_the_clients_sent(work: Path) -> None:
    # 3 clients, fanout 2: leaf 0 (clients 0, 1) on leaf server 0, leaf 1 (client 2) on server 1
    r = sf_round.run_sf_round(work, LAYOUT, 3, timeout=120, distinct_weights=True)
    assert r["ok"], r
    assert r["clients"] == 3 and r["update_bytes"] == 1_000_000
    assert r["leaves"] == 2 and r["leaf_servers"] == 2 and r["updates_merged"] == 3
    assert r["server_processes"] == 3  # two leaf servers and the top
    # measured (not None); 0 when the round ends within the poll's lag (round_window.server_window_s)
    assert r["server_s"] is not None and 0 <= r["server_s"] <= r["e2e_s"]
    assert r["encode_s_max"] > 0 and r["server_hwm_bytes"] > 0
    got = wire.decode_tensors((work / "sf-3c1m" / "global.safetensors").read_bytes())
    # what client k sent: write_weights with seed k, sample count 100 + k
    sent = []
    for k in range(3):
        path = work / f"w{k}"
        rc.write_weights(path, LAYOUT, seed=k)
        sent.append(rc.map_weights(path, LAYOUT))
    samples = [100.0, 101.0, 102.0]
    for name, _ in LAYOUT:
        want = fedavg.fedavg_reference([s[name] for s in sent], samples)
        assert fedavg.rel_error(got[name], want) < 1e-6, name
    # the weighting shows: the plain mean is measurably off
    name = LAYOUT[0][0]
    mean = np.mean([s[name] for s in sent], axis=0)
    assert fedavg.rel_error(got[name], mean) > 1e-4
    assert not _leftovers()


@pytest.mark.integration
def test_rounds_of_two_sizes_with_one_tag_share_a_work_folder(work: Path) -> None:
    # bench.scale's size axis: the same client count and repeat's tag at each size, one work
    # folder (at 1d83e63 the second size's rounds failed on the first one's folder)
    small = rc.scaled_layout(rc.resnet18_layout(), 2_000_000)
    for layout in (LAYOUT, small):
        r = sf_round.run_sf_round(work, layout, 1, timeout=120, tag="x3c0r0")
        assert r["ok"], r
    assert (work / "sf-x3c0r01c1m" / "global.safetensors").is_file()
    assert (work / "sf-x3c0r01c2m" / "global.safetensors").is_file()
    assert not _leftovers()


@pytest.mark.integration
def test_a_round_the_guard_stops_is_a_killed_record(work: Path) -> None:
    r = sf_round.run_sf_round(work, LAYOUT, 2, mem_limit_bytes=1, timeout=120)
    assert r["ok"] is False and r["failure"] == "killed", r
    assert "over the limit" in r["detail"] and r["server_rss_bytes"] > 1
    assert r["clients"] == 2 and r["update_bytes"] == 1_000_000
    assert not _leftovers()


@pytest.fixture
def servers(work: Path) -> Iterator[sf_round.SFServers]:
    """A top and two leaf servers for 4 clients (leaves 0 and 1), no round running."""
    srv = sf_round.SFServers(work, LAYOUT, sf_servers.plan_leaves(4, 2, 2))
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def _json_error(r: httpx.Response, status: int) -> dict[str, str]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] and body["detail"]
    return dict(body)


@pytest.mark.integration
def test_every_route_but_health_needs_the_token(servers: sf_round.SFServers) -> None:
    leaf = servers.leaf_url(servers.leaves[0])
    top = servers.top_url
    assert httpx.get(f"{top}/healthz").status_code == 200
    bad = {"Authorization": "Bearer wrong"}
    _json_error(httpx.post(leaf, content=b"x", headers={"X-Sample-Count": "1"}), 401)
    _json_error(httpx.post(leaf, content=b"x", headers={**bad, "X-Sample-Count": "1"}), 401)
    # the client token is not the top's
    client = {"Authorization": f"Bearer {servers.client_token}"}
    _json_error(httpx.post(f"{top}/v1/partials", content=b"x", headers=client), 401)
    for path in ("/v1/status", "/v1/model"):
        _json_error(httpx.get(f"{top}{path}"), 401)


@pytest.mark.integration
def test_an_unauthenticated_request_is_answered_before_its_body_is_read(
    servers: sf_round.SFServers,
) -> None:
    # a 1 GB Content-Length and no body: a server that read the body first would never answer
    port = servers.leaf_ports[0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /v1/leaves/0/updates HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
            b"X-Sample-Count: 1\r\n\r\n"
        )
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 401"), head


@pytest.mark.integration
def test_bad_updates_and_partials_get_a_4xx_json_error(servers: sf_round.SFServers) -> None:
    client = {"Authorization": f"Bearer {servers.client_token}", "X-Sample-Count": "10"}
    leaf = servers.leaf_url(servers.leaves[0])
    e = _json_error(httpx.post(leaf, content=b"\x07not safetensors", headers=client), 400)
    assert e["error"] == "malformed_update"
    e = _json_error(httpx.post(leaf, content=b"x", headers={**client, "X-Sample-Count": "0"}), 400)
    assert e["error"] == "bad_header" and "X-Sample-Count" in e["detail"]
    # leaf 1 lives on the other leaf server
    other = leaf.replace("/leaves/0/", "/leaves/1/")
    assert _json_error(httpx.post(other, content=b"x", headers=client), 404)["error"]
    top = {"Authorization": f"Bearer {servers.top_token}", "X-Leaf": "0", "X-Count": "2"}
    url = f"{servers.top_url}/v1/partials"
    e = _json_error(httpx.post(url, content=b"x" * 8, headers={**top, "X-Weight": "3"}), 400)
    assert e["error"] == "bad_length"
    e = _json_error(httpx.post(url, content=b"x", headers={**top, "X-Weight": "nan"}), 400)
    assert e["error"] == "bad_header"
    e = _json_error(_top_get(servers, "/v1/model"), 409)
    assert e["error"] == "not_available" and "0/4" in e["detail"]


@pytest.mark.integration
def test_a_full_leaf_hands_its_partial_to_the_top_and_refuses_more(
    servers: sf_round.SFServers,
) -> None:
    rng = np.random.default_rng(7)
    body = wire.encode_tensors({n: rng.standard_normal(s).astype(np.float32) for n, s in LAYOUT})
    client = {"Authorization": f"Bearer {servers.client_token}", "X-Sample-Count": "10"}
    leaf = servers.leaf_url(servers.leaves[0])
    assert httpx.post(leaf, content=body, headers=client).json()["handed_off"] is False
    assert httpx.post(leaf, content=body, headers=client).json()["handed_off"] is True
    assert _json_error(httpx.post(leaf, content=body, headers=client), 409)["error"] == "leaf_full"
    st = _top_get(servers, "/v1/status").json()
    assert st["count"] == 2 and st["weight"] == 20.0 and st["leaves_merged"] == 1
    assert st["published_ns"] == 0  # leaf 1's two updates are still missing
    # the top refuses the same leaf twice
    top = {"Authorization": f"Bearer {servers.top_token}", "X-Leaf": "0", "X-Count": "2"}
    partial = b"\0" * sf_servers.model_spec(LAYOUT).data_nbytes
    r = httpx.post(
        f"{servers.top_url}/v1/partials", content=partial, headers={**top, "X-Weight": "20"}
    )
    assert _json_error(r, 409)["error"] == "bad_leaf"


def _top_get(servers: sf_round.SFServers, path: str) -> httpx.Response:
    return httpx.get(
        f"{servers.top_url}{path}", headers={"Authorization": f"Bearer {servers.top_token}"}
    )


@pytest.mark.integration
def test_a_leaf_whose_top_is_gone_answers_its_last_client_502(
    servers: sf_round.SFServers,
) -> None:
    name, top, _ = servers.procs[0]
    assert name == "top"
    top.kill()
    top.wait(10)
    body = wire.encode_tensors({n: np.ones(s, np.float32) for n, s in LAYOUT})
    client = {"Authorization": f"Bearer {servers.client_token}", "X-Sample-Count": "10"}
    leaf = servers.leaf_url(servers.leaves[0])
    assert httpx.post(leaf, content=body, headers=client).status_code == 202
    e = _json_error(httpx.post(leaf, content=body, headers=client), 502)
    assert e["error"] == "hand_off_failed" and "could not be reached" in e["detail"]
