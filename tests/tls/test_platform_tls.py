"""``fedfaas up --with all,prometheus`` (TLS is the default): one platform whose runtime, node gateways, cache engine,
request tracker, control plane and console serve HTTPS with the certificates ``up`` minted.

* ``fedfaas status`` prints their https addresses and the CA's path; the secrets are 0600;
* Prometheus scrapes the node gateways over https (both targets up);
* the README's job through the SDK (``ca_file``: the platform's CA, no environment), to its
  end: the control plane reaches the gateways, the gateways each other and the cache engine,
  over mTLS;
* FLStore queries through the tracker (tracker -> engine -> the cache functions), one of
  them scored by the job's evaluator function, which a cache function calls through the
  runtime over https, trusting the CA that ``FEDFAAS_TLS_CA_FILE`` names: no process of the
  platform (parts, function replicas) has ``SSL_CERT_FILE`` in its environment;
* plain HTTP to a TLS port answered a 400 ``tls_required``, and a client certificate from another CA refused
  at the handshake, on every part's port; the cache engine (which only the parts call) also
  refuses a client without a certificate (mTLS), the others let the SDK's kind in;
* every function replica serves HTTPS on loopback to the platform's parts only (mTLS), and
  the tracker's calls to the cache functions at their own addresses go over it.
"""

from __future__ import annotations

import contextlib
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.tls import CA_FILE_ENV, TlsFiles, mint_ca, mint_cert
from fedfaas.platform import state
from fedfaas.platform.context import INTERNAL_PARTS, TLS_PORTS
from tests.commands import run_module
from tests.platform.running import any_ports_env, platform_processes, running_platform
from tests.polling import wait_until
from tests.tls.certs import assert_plain_http_refused
from tests.tls.test_gateway_tls import _tls_get

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: the ports of the parts that require a client certificate (``Context.tls_settings``)
INTERNAL_PORTS = {p.replace("-", "_") for p in INTERNAL_PARTS}


@dataclass
class Platform:
    state_dir: Path
    host: str
    ports: dict[str, int]
    env: dict[str, str]
    pids: dict[str, int]

    @property
    def ca(self) -> Path:
        return self.state_dir / "secrets" / "tls" / "ca.crt"

    def url(self, port: str) -> str:
        return f"https://{self.host}:{self.ports[port]}"

    def secret(self, name: str) -> str:
        return (self.state_dir / "secrets" / name).read_text().strip()

    def tls_file(self, name: str) -> Path:
        """A file of the platform's ``secrets/tls`` (a part's certificate or key)."""
        return self.ca.parent / name


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    state_dir = tmp_path_factory.mktemp("tls-platform") / "state"
    env = any_ports_env()
    env.pop("SSL_CERT_FILE", None)  # whatever the parts trust, none comes from this shell
    with running_platform(
        state_dir, "--with", "all,prometheus", env=env, timeout=300, tls=True
    ) as st:
        assert st.tls
        pids = {r.name: r.pid for r in st.services}
        yield Platform(state_dir, st.host, dict(st.ports), env, pids)


def test_status_prints_https_addresses_and_the_ca(platform: Platform) -> None:
    out = run_module(
        "fedfaas.cli", "status", "--state-dir", str(platform.state_dir), env=platform.env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"TLS CA: {platform.ca}" in out.stdout
    for port in TLS_PORTS & set(platform.ports):
        assert platform.url(port) in out.stdout, (port, out.stdout)
    tls_dir = platform.ca.parent
    assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
    files = sorted(p.name for p in tls_dir.iterdir())
    assert "ca.crt" in files and "ca.key" not in files  # nothing signs after up
    assert {"gateway-node0.key", "control-plane.key", "runtime.key"} <= set(files)
    assert all(stat.S_IMODE((tls_dir / f).stat().st_mode) == 0o600 for f in files)


def test_prometheus_scrapes_both_node_gateways_over_https(platform: Platform) -> None:
    """``--with prometheus`` on the TLS platform: Prometheus (plain HTTP on loopback) scrapes
    both node gateways' ``/metrics`` over https, verifying them against the platform's CA and
    presenting ``fedfaas``'s certificate; both targets are up."""
    targets_url = f"http://{platform.host}:{platform.ports['prometheus']}/api/v1/targets"
    gateways = {f"{platform.url(p)}/metrics" for p in ("gateway", "gateway_node1")}

    def up_over_https() -> dict[str, str]:
        active = httpx.get(targets_url, timeout=10).json()["data"]["activeTargets"]
        health = {t["scrapeUrl"]: t["health"] for t in active}
        return health if all(health.get(url) == "up" for url in gateways) else {}

    health = wait_until(up_over_https, 60, "both node gateways up in Prometheus over https")
    assert gateways <= set(health)


def test_faas_cli_reaches_the_https_runtime_trusting_the_ca_through_ssl_cert_file(
    platform: Platform, tmp_path: Path
) -> None:
    """docs/operations.md: faas-cli (Go) verifies the runtime against the CA that
    ``SSL_CERT_FILE`` names; without it the platform's CA is unknown and it fails."""
    import subprocess

    from tests.openfaas.conftest import require_binary

    faas_cli = str(require_binary("faas-cli"))
    gateway = platform.url("runtime")
    base = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def run(*args: str, env: dict[str, str], stdin: str | None = None) -> tuple[int, str]:
        out = subprocess.run(
            [faas_cli, *args, "--gateway", gateway],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        return out.returncode, out.stdout + out.stderr

    trusting = {**base, "SSL_CERT_FILE": str(platform.ca)}
    user, password = platform.secret("basic-auth-user"), platform.secret("basic-auth-password")
    code, said = run("login", "-u", user, "--password-stdin", env=trusting, stdin=password)
    assert code == 0, said
    code, said = run("list", env=trusting)
    assert code == 0 and "echo" in said and "aggregator" in said, said
    code, said = run("list", env=base)  # the system's CAs: this platform's is not one of them
    assert code != 0 and "Cannot connect to OpenFaaS" in said, said
    code, said = run("list", "--tls-no-verify", env=base)  # no check at all
    assert code == 0 and "echo" in said, said


def test_the_readme_job_through_the_sdk_over_https_then_a_query(platform: Platform) -> None:
    from client.data import federated_digits
    from client.model import load_bytes_into, make_model, model_to_bytes
    from client.sdk import submit_job
    from client.train import TrainConfig, train_local

    data = federated_digits(4, seed=1)
    job = submit_job(
        platform.url("control_plane"),
        "quick",
        model_to_bytes(make_model(0, "softmax")),
        rounds=2,
        goal=4,
        admin_token=platform.secret("gateway-admin-secret"),
        tracker_url=platform.url("request_tracker"),
        analyst_token=platform.secret("analyst-token"),
        ca_file=platform.ca,
        evaluator={"kind": "function", "function": "digits-evaluator"},
    )
    job.enroll([c.client_id for c in data.clients])
    for rnd in (1, 2):
        for c in data.clients:
            with job.client(c.client_id, round=rnd) as fl:
                assert fl.gateway_url.startswith("https://")
                model = fl.wait_for_version(rnd - 1).data
                net = load_bytes_into(make_model(0, "softmax"), model)
                fit = train_local(net, c.x, c.y, TrainConfig())
                fl.upload(rnd, net.state_dict(), fit.num_samples)
    job.wait(timeout=300)
    assert [(r["round"], r["state"]) for r in job.history()] == [(1, "closed"), (2, "closed")]
    krum = job.query("multi-krum", rounds=[2], params={"f": 1}, wait=180)
    assert set(krum["result"]["scores"]) == {c.client_id for c in data.clients}
    # scored by digits-evaluator: a cache function's call through the runtime over https
    loo_answer = job.query("leave-one-out", rounds=[2], wait=180)
    loo = loo_answer["result"]
    assert set(loo["values"]) == {c.client_id for c in data.clients}
    assert 0.0 < loo["v_full"] <= 1.0, loo  # the full model's accuracy on the digits
    # the tracker called the cache functions' replicas at their own https addresses, over mTLS
    # (a failed direct call would be recorded, then retried through the runtime)
    steps = [*krum["tried"], *loo_answer["tried"]]
    assert not [s for s in steps if "direct_failed" in s], steps
    assert "direct" in [s.get("via") for s in steps], steps
    _no_process_trusts_the_ca_through_ssl_cert_file(platform)


def _no_process_trusts_the_ca_through_ssl_cert_file(platform: Platform) -> None:
    """Every process of the platform (its parts and the function replicas they started) names
    the CA in ``FEDFAAS_TLS_CA_FILE`` where it has it, and none has ``SSL_CERT_FILE``, so a
    function's calls to outside https services keep the system's CAs."""
    now = state.load(platform.state_dir)  # the supervisor may have restarted a part
    assert now is not None
    parts = {r.name: r.pid for r in now.services}
    environs = {}
    for pid in platform_processes(now):
        with contextlib.suppress(OSError):  # a process that ended since
            environs[pid] = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert set(parts.values()) <= set(environs)
    assert len(environs) > len(parts)  # the function replicas too
    leaking = [
        pid for pid, env in environs.items() if any(v.startswith(b"SSL_CERT_FILE=") for v in env)
    ]
    assert not leaking, leaking
    ca = f"{CA_FILE_ENV}={platform.ca}".encode()
    for part in ("runtime", "cache-engine", "request-tracker"):
        assert ca in environs[parts[part]], part


def test_the_console_reads_the_control_plane_over_mtls(platform: Platform) -> None:
    """The console serves HTTPS, sets its session cookie ``Secure``, and its own calls reach
    the control plane (which verifies its certificate): the job of the README test is listed."""
    verify = ssl.create_default_context(cafile=str(platform.ca))
    with httpx.Client(base_url=platform.url("console"), verify=verify) as console:
        login = console.post("/login", data={"token": platform.secret("analyst-token")})
        assert login.status_code == 303, login.text
        assert "secure" in login.headers["set-cookie"].lower()
        jobs = console.get("/api/jobs")
    assert jobs.status_code == 200, jobs.text
    assert "quick" in jobs.text


@pytest.mark.parametrize(
    "port", ["gateway", "control_plane", "console", "runtime", "request_tracker", "cache_engine"]
)
def test_plain_http_and_a_stranger_certificate_are_refused(
    platform: Platform, port: str, tmp_path: Path
) -> None:
    assert_plain_http_refused(platform.url(port))  # a JSON 400 naming the https address
    other = mint_ca(tmp_path / "other", name="another CA")
    stranger = mint_cert(other, tmp_path / "other", "stranger", ["127.0.0.1"])
    presenting = TlsFiles(stranger.cert, stranger.key, platform.ca)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        _tls_get(platform.ports[port], presenting.client_context())
    no_cert = ssl.create_default_context(cafile=str(platform.ca))  # the SDK's kind
    if port in INTERNAL_PORTS:  # only the platform's parts call it: their certificates only
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _tls_get(platform.ports[port], no_cert)
        part = TlsFiles(
            platform.tls_file("fedfaas.crt"), platform.tls_file("fedfaas.key"), platform.ca
        )
        ok = httpx.get(platform.url(port) + "/healthz", verify=part.client_context())
    else:  # the SDK, faas-cli or a browser: let in with the CA alone
        ok = httpx.get(platform.url(port) + "/healthz", verify=no_cert)
    assert ok.status_code == 200


def test_the_function_replicas_serve_https_to_the_platform_s_parts_only(
    platform: Platform, tmp_path: Path
) -> None:
    """Every replica the runtime started (the aggregators, the cache functions, echo, the
    evaluator) listens on HTTPS with the ``functions`` certificate: plain HTTP, a client
    without a certificate and one of another CA are refused; a part's certificate gets in."""
    verify = ssl.create_default_context(cafile=str(platform.ca))
    auth = (platform.secret("basic-auth-user"), platform.secret("basic-auth-password"))
    with httpx.Client(base_url=platform.url("runtime"), verify=verify, auth=auth) as runtime:
        names = [f["name"] for f in runtime.get("/system/functions").json()]
        replicas = [r for n in names for r in runtime.get(f"/system/replicas/{n}").json()]
    ports = [int(r["port"]) for r in replicas if r["state"] == "ready"]
    assert len(ports) >= len(names) >= 3, replicas  # echo, digits-evaluator, aggregator, ...
    other = mint_ca(tmp_path / "other", name="another CA")
    stranger = mint_cert(other, tmp_path / "other", "stranger", ["127.0.0.1"])
    part = TlsFiles(
        platform.tls_file("request-tracker.crt"),
        platform.tls_file("request-tracker.key"),
        platform.ca,
    )
    for port in ports:
        assert_plain_http_refused(f"https://127.0.0.1:{port}", "/_/health")
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _tls_get(port, verify)
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _tls_get(port, TlsFiles(stranger.cert, stranger.key, platform.ca).client_context())
        ok = httpx.get(f"https://127.0.0.1:{port}/_/health", verify=part.client_context())
        assert ok.status_code == 200, (port, ok.text)


def test_a_gateway_s_internal_routes_take_the_control_plane_s_certificate_only(
    platform: Platform,
) -> None:
    """A round's close (a route only the control plane calls, :mod:`gateway.callers`) with the
    admin secret: refused 403 ``client_certificate_required`` without a certificate (the SDK's
    kind) and with the function replicas' certificate, which a function's own code can read;
    with the control plane's it reaches the route (the job does not exist: 404)."""
    url = platform.url("gateway") + "/v1/jobs/nosuchjob/rounds/1/close"
    admin = {"Authorization": f"Bearer {platform.secret('gateway-admin-secret')}"}

    def close(cert: str | None) -> httpx.Response:
        if cert is None:
            verify = ssl.create_default_context(cafile=str(platform.ca))
        else:
            files = TlsFiles(
                platform.tls_file(f"{cert}.crt"), platform.tls_file(f"{cert}.key"), platform.ca
            )
            verify = files.client_context()
        return httpx.post(url, headers=admin, verify=verify, timeout=30)

    for cert in (None, "functions"):
        r = close(cert)
        assert r.status_code == 403, (cert, r.text)
        assert r.json()["error"] == "client_certificate_required", r.text
    r = close("control-plane")
    assert r.status_code == 404, r.text
