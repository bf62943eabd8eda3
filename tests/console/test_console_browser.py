"""The console in a real browser (Debian's headless Chromium, Selenium) while a job runs on
``fedfaas up --with all,prometheus``: refused without a login; logs in; sees the job's rounds
appear live; asks a Shapley query and sees its chart, and a k-means one; downloads the global
model from a checkpoint link and finds it equal to the gateway's; sees each node's router
endpoints and store on the data-plane page, with the rates from the platform's Prometheus;
revokes a client (refused first for too few clients left, then forced) and every gateway of the
job refuses its token; is refused a state change without the CSRF token, and stops the job with
it; logs out.

Each page is photographed on the way (``FEDFAAS_CONSOLE_SHOTS``: the folder, ``docs/console``
for ``make docs-console``; a temporary one otherwise).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.checkpoints.keys import global_key
from tests.commands import run_module
from tests.console.browser import (
    chromium,
    fetch_status,
    require_browser,
    screenshot,
    wait_until,
)
from tests.platform.running import any_ports_env, running_platform

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB, ROUNDS, CLIENTS = "console-demo", 3, 6
PORTS = ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane", "console")


@dataclass
class Platform:
    state_dir: Path
    urls: dict[str, str]

    def secret(self, name: str) -> str:
        return (self.state_dir / "secrets" / name).read_text().strip()


@dataclass
class RunningJob:
    """The job the browser watches: its clients train round r once ``go[r - 1]`` is set (the
    test sets it when the browser has shown round r - 1 closed)."""

    handle: Any
    go: list[threading.Event] = field(
        default_factory=lambda: [threading.Event() for _ in range(ROUNDS)]
    )
    errors: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("FEDFAAS_CONSOLE_SHOTS")
    out = Path(folder) if folder else tmp_path_factory.mktemp("shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    require_browser()  # before minutes of start-up
    state_dir = tmp_path_factory.mktemp("console") / "state"
    env = any_ports_env(FEDFAAS_PORTS=json.dumps(dict.fromkeys(PORTS, 0)))
    with running_platform(state_dir, "--with", "all,prometheus", env=env, timeout=600) as st:
        urls = {name: f"http://{st.host}:{port}" for name, port in st.ports.items()}
        status = run_module(
            "fedfaas.cli", "status", "--state-dir", str(state_dir), env=env, timeout=120
        )
        assert urls["console"] in status.stdout, status.stdout  # `fedfaas status` shows it
        assert urls["prometheus"] in status.stdout, status.stdout
        yield Platform(state_dir, urls)


def _train(job: RunningJob, data: Any) -> None:
    from client.model import load_bytes_into, make_model
    from client.train import TrainConfig, evaluate, train_local

    try:
        for rnd in range(1, ROUNDS + 1):
            assert job.go[rnd - 1].wait(timeout=600), f"the browser never got to round {rnd}"
            for c in data.clients:
                with job.handle.client(c.client_id, round=rnd) as fl:
                    model = make_model(0, "softmax")
                    load_bytes_into(model, fl.wait_for_version(rnd - 1).data)
                    res = train_local(model, c.x, c.y, TrainConfig())
                    accuracy = evaluate(model, c.x, c.y).accuracy  # on its own data
                    meta = {"loss": res.mean_loss, "accuracy": accuracy}
                    fl.upload(rnd, model.state_dict(), res.num_samples, meta=meta)
    except BaseException as exc:  # the test reports it
        job.errors.append(exc)


@pytest.fixture(scope="module")
def job(platform: Platform) -> Iterator[RunningJob]:
    from client.data import federated_digits
    from client.model import make_model, model_to_bytes
    from client.sdk import submit_job

    data = federated_digits(CLIENTS, seed=1)
    handle = submit_job(
        platform.urls["control_plane"],
        JOB,
        model_to_bytes(make_model(0, "softmax")),
        rounds=ROUNDS,
        goal=CLIENTS,
        admin_token=platform.secret("gateway-admin-secret"),
        evaluator={"kind": "function", "function": "digits-evaluator"},
        tracker_url=platform.urls["request_tracker"],
        analyst_token=platform.secret("analyst-token"),
    )
    handle.enroll([c.client_id for c in data.clients])
    running = RunningJob(handle)
    running.thread = threading.Thread(target=_train, args=(running, data), daemon=True)
    running.thread.start()
    yield running
    for go in running.go:
        go.set()
    running.thread.join(timeout=300)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(platform: Platform, downloads: Path) -> Iterator[Any]:
    with chromium(downloads) as d:
        yield d


def _csrf(d: Any) -> str:
    return str(d.find_element("css selector", "meta[name=csrf-token]").get_attribute("content"))


def _rows(d: Any) -> dict[int, str]:
    """The job page's timeline: round -> state (read in one script: the page redraws the
    table at each poll, so elements found in one call may be gone by the next)."""
    pairs = d.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-table tbody tr'))"
        ".map((r) => [r.dataset.round, r.dataset.state]);"
    )
    return {int(r): str(st) for r, st in pairs}


def _state(d: Any, job: RunningJob, rnd: int) -> str | None:
    """Round ``rnd``'s state on the page; the clients' error, if one failed, at once."""
    assert not job.errors, job.errors
    return _rows(d).get(rnd)


def test_refused_without_a_login(platform: Platform, shots: Path, tmp_path: Path) -> None:
    with chromium(tmp_path) as d:
        d.get(platform.urls["console"] + "/jobs")
        wait_until(d, "the login form", lambda d: d.find_elements("id", "token"))
        assert d.current_url.endswith("/login")
        screenshot(d, shots / "login.png")
        assert fetch_status(d, "/api/jobs") == 401
        assert fetch_status(d, f"/api/jobs/{JOB}/stop", "POST") == 401
        d.find_element("id", "token").send_keys("not-the-token")
        d.find_element("id", "login").click()
        wait_until(d, "the refusal", lambda d: d.find_elements("id", "error"))
        assert fetch_status(d, "/api/jobs") == 401


def test_logs_in_and_sees_the_rounds_appear_live(
    platform: Platform, job: RunningJob, browser: Any, shots: Path
) -> None:
    d = browser
    d.get(platform.urls["console"] + "/login")
    d.find_element("id", "token").send_keys(platform.secret("gateway-admin-secret"))
    d.find_element("id", "login").click()
    wait_until(d, "the overview", lambda d: d.find_elements("css selector", "#gateways-table td"))
    d.get(f"{platform.urls['console']}/jobs/{JOB}")
    wait_until(d, "round 1 open", lambda d: _rows(d).get(1) == "open")
    d.execute_script("window.sameLoad = true;")  # gone if the page loads again
    for rnd in range(1, ROUNDS + 1):
        job.go[rnd - 1].set()  # the clients train round rnd now, as the page watches
        wait_until(d, f"round {rnd} closed", lambda d, r=rnd: _state(d, job, r) == "closed", 600)
        if rnd < ROUNDS:
            wait_until(d, f"round {rnd + 1} open", lambda d, r=rnd + 1: _state(d, job, r) == "open")
    assert d.execute_script("return window.sameLoad === true;"), "the page was loaded again"
    drawn = "#series-chart polyline[data-series=loss] ~ polyline[data-series=accuracy]"
    wait_until(d, "the loss and accuracy chart", lambda d: d.find_elements("css selector", drawn))
    screenshot(d, shots / "job.png")
    d.get(platform.urls["console"] + "/jobs")
    wait_until(
        d, "the job in the list", lambda d: d.find_elements("css selector", f"tr[data-job={JOB}]")
    )
    screenshot(d, shots / "jobs.png")
    d.get(platform.urls["console"] + "/")

    def gateway_rows(d: Any) -> list[list[str]] | None:
        """node0's and node1's rows once both show a router mode and the admin's endpoint
        count (a redraw while one gateway was slow to answer shows neither for it)."""
        rows: list[list[str]] = d.execute_script(
            "return Array.from(document.querySelectorAll('#gateways-table tbody tr'))"
            ".map((r) => [r.dataset.router, r.lastChild.textContent]);"
        )
        whole = all(mode in ("ebpf", "userspace") and count.isdigit() for mode, count in rows)
        return rows if len(rows) == 2 and whole else None

    wait_until(d, "both gateways' router modes and endpoint counts", gateway_rows)
    # redrawn every few seconds: read inside the wait (a stale element is read again)
    wait_until(
        d, "the version line", lambda d: d.find_element("id", "version").text.startswith("version ")
    )
    screenshot(d, shots / "overview.png")


def test_asks_a_shapley_query_and_sees_its_chart(
    platform: Platform, job: RunningJob, browser: Any, shots: Path
) -> None:
    d = browser
    d.get(platform.urls["console"] + "/flstore")
    wait_until(
        d, "the query form", lambda d: d.find_elements("css selector", f"#job option[value={JOB}]")
    )
    from selenium.webdriver.support.ui import Select

    Select(d.find_element("id", "workload")).select_by_value("shapley")
    Select(d.find_element("id", "job")).select_by_value(JOB)
    rnd = d.find_element("id", "round")
    rnd.clear()
    rnd.send_keys("1")  # the round that moved the model most: values well apart from 0
    d.find_element("id", "ask").click()
    bars = wait_until(
        d,
        "the Shapley chart",
        lambda d: d.find_elements("css selector", "#answer-chart rect.bar"),
        300,
    )
    assert len(bars) == CLIENTS
    answer = json.loads(d.find_element("id", "answer-json").text)
    assert answer["workload"] == "shapley" and len(answer["values"]) == CLIENTS
    assert {b.get_attribute("data-label") for b in bars} == set(answer["values"])
    assert "answered in" in d.find_element("id", "cost").text
    screenshot(d, shots / "flstore.png")
    # clustering: k-means of the round's updates, each client's cluster drawn
    Select(d.find_element("id", "workload")).select_by_value("kmeans")
    assert json.loads(d.find_element("id", "params").get_attribute("value")) == {"k": 2}
    d.find_element("id", "ask").click()
    wait_until(
        d,
        "the k-means chart",
        lambda d: (
            "kmeans"
            in d.execute_script(  # one read: the chart is redrawn whole
                "const t = document.querySelector('#answer-chart .title');"
                "return t ? t.textContent : '';"
            )
        ),
        300,
    )
    answer = json.loads(d.find_element("id", "answer-json").text)
    values = answer["labels"]
    assert answer["k"] == 2 and len(values) == CLIENTS and set(values.values()) <= {0, 1}
    bars = d.find_elements("css selector", "#answer-chart rect.bar")
    assert {
        b.get_attribute("data-label"): int(b.get_attribute("data-value")) for b in bars
    } == values


def test_downloads_the_global_model_from_its_checkpoint_link(
    platform: Platform, job: RunningJob, browser: Any, shots: Path, downloads: Path
) -> None:
    d = browser
    key = global_key(JOB, ROUNDS)

    def link(d: Any) -> Any:
        found = d.find_elements("css selector", f"a.download[data-key='{key}']")
        if not found:
            d.refresh()  # the checkpoint is written in the background: the poll reloads
        return found[0] if found else None

    d.get(f"{platform.urls['console']}/checkpoints?job={JOB}")
    a = wait_until(d, f"the link of {key}", link, 300)
    href = str(a.get_attribute("href"))
    assert href.startswith(platform.urls["minio"]) and "X-Amz-Expires=" in href
    minio_console = d.find_element("id", "minio-console").get_attribute("href")
    assert str(minio_console).startswith(platform.urls["minio_console"])
    screenshot(d, shots / "checkpoints.png")
    a.click()
    gateway = job.handle.model().data  # from the job's root node gateway
    target = downloads / key.rsplit("/", 1)[1]
    wait_until(
        d, "the download", lambda d: target.is_file() and target.stat().st_size == len(gateway)
    )
    assert target.read_bytes() == gateway


def test_the_data_plane_page_shows_each_nodes_router_and_store(
    platform: Platform, job: RunningJob, browser: Any, shots: Path
) -> None:
    d = browser
    d.get(platform.urls["console"] + "/dataplane")
    rows = "#dataplane-table tbody tr[data-router]"
    wait_until(d, "both nodes' routers", lambda d: len(d.find_elements("css selector", rows)) == 2)
    nodes = d.execute_script(
        f"return Array.from(document.querySelectorAll('{rows}'))"
        ".map((r) => [r.dataset.node, r.dataset.router, Number(r.dataset.ingest)]);"
    )
    assert {n for n, _, _ in nodes} == {"node0", "node1"}, nodes
    assert all(mode in ("ebpf", "userspace") for _, mode, _ in nodes), nodes
    assert sum(ingest for _, _, ingest in nodes) > 0, nodes  # the job's updates came in
    # the aggregator replicas' endpoints with their counters, the job's objects in a store
    wait_until(
        d,
        "router endpoints that received frames",
        lambda d: d.execute_script(
            "return Array.from(document.querySelectorAll('#endpoints-table tr[data-frames]'))"
            ".some((r) => Number(r.dataset.frames) > 0);"
        ),
    )
    wait_until(
        d,
        "the job's store",
        lambda d: d.find_elements("css selector", f"#store-table tr[data-job={JOB}]"),
    )
    # the ingest rates (0 once the job is done), PromQL's over the gateways' /metrics that the
    # platform's Prometheus scrapes with the admin secret: a node it could not scrape has none
    wait_until(
        d,
        "both nodes' ingest rates from Prometheus",
        lambda d: (
            "from Prometheus" in d.find_element("css selector", "#nodes h2").text
            and len(d.find_elements("css selector", "tr[data-rate]")) == 2
        ),
    )
    screenshot(d, shots / "dataplane.png")


def test_revokes_a_client_and_every_gateway_refuses_it(
    platform: Platform, job: RunningJob, browser: Any, shots: Path
) -> None:
    d = browser
    client = sorted(job.handle.tokens)[-1]
    mine = {"Authorization": f"Bearer {job.handle.tokens[client]}"}
    gateways = [platform.urls["gateway"], platform.urls["gateway_node1"]]
    before = {
        g: httpx.get(f"{g}/v1/jobs/{JOB}", headers=mine, timeout=30).status_code for g in gateways
    }
    assert 200 in before.values(), before  # the client's token reads its job somewhere
    d.get(f"{platform.urls['console']}/jobs/{JOB}")
    wait_until(d, "the revoke form", lambda d: d.find_elements("id", "revoke-form"))
    assert fetch_status(d, f"/api/jobs/{JOB}/clients/{client}/revoke", "POST") == 403  # no CSRF
    result = "revoke-result"

    def revoke() -> None:
        field = d.find_element("id", "revoke-client")
        field.clear()
        field.send_keys(client)
        d.find_element("id", "revoke").click()
        d.switch_to.alert.accept()  # the confirmation

    revoke()  # 5 clients would be left for a goal of 6: refused, nothing revoked
    wait_until(d, "the refusal", lambda d: "409" in d.find_element("id", result).text)
    assert "too_few_clients" in d.find_element("id", result).text
    d.find_element("id", "revoke-force").click()
    revoke()
    wait_until(
        d, "the revocation", lambda d: d.find_element("id", result).text.startswith("revoked")
    )
    wait_until(d, "the revoked list", lambda d: client in d.find_element("id", "revoked").text)
    screenshot(d, shots / "revoke.png")
    view = f"{platform.urls['control_plane']}/v1/jobs/{JOB}"
    analyst = {"Authorization": f"Bearer {platform.secret('analyst-token')}"}
    assert httpx.get(view, headers=analyst, timeout=30).json()["revoked"] == [client]
    for g, status in before.items():
        if status == 200:  # a gateway of the job: the client's token is refused there now
            r = wait_until(
                d,
                f"{g} refusing {client}",
                lambda d, g=g: (
                    r
                    if (r := httpx.get(f"{g}/v1/jobs/{JOB}", headers=mine, timeout=30)).status_code
                    == 403
                    else None
                ),
            )
            assert r.json()["error"] == "client_revoked", r.text


def test_refused_a_state_change_without_the_csrf_token(
    platform: Platform, job: RunningJob, browser: Any
) -> None:
    d = browser
    d.get(f"{platform.urls['console']}/jobs/{JOB}")
    stop = wait_until(d, "the stop button", lambda d: d.find_elements("id", "stop-job"))[0]
    assert fetch_status(d, f"/api/jobs/{JOB}/stop", "POST") == 403
    assert fetch_status(d, f"/api/jobs/{JOB}/stop", "POST", csrf="forged") == 403
    view = f"{platform.urls['control_plane']}/v1/jobs/{JOB}"
    analyst = {"Authorization": f"Bearer {platform.secret('analyst-token')}"}
    assert httpx.get(view, headers=analyst, timeout=30).status_code == 200  # still there
    stop.click()  # the page sends its CSRF token
    d.switch_to.alert.accept()
    wait_until(
        d,
        "the job stopped",
        lambda d: httpx.get(view, headers=analyst, timeout=30).status_code == 404,
    )
    d.find_element("id", "logout").click()
    wait_until(d, "the login form", lambda d: d.current_url.endswith("/login"))
    assert fetch_status(d, "/api/jobs") == 401
