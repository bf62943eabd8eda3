"""No secret of a running platform leaks where others can read it.

``fedfaas up --with all`` (its default: TLS, so the parts' private keys are secrets too), then
a round of a job in MinIO served by an FLStore query (so the
cache engine has deployed a cache function and loaded the round into it with the per-job
credentials it mints). Then no value of any file in the secrets folder appears:

- in the runtime's ``GET /system/functions`` (every function's env vars, labels, annotations):
  the cache functions have no MinIO user of their own;
- on the command line (``/proc/<pid>/cmdline``) or in the environment (``/proc/<pid>/environ``)
  of any process of the platform (its parts, MinIO, Redis, the function replicas).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.synthetic import write_history
from cache_engine.cold_store import MinioColdStore
from fedfaas.platform import credentials, state
from fedfaas.platform.context import Context
from tests.platform.running import any_ports_env, platform_processes, running_platform

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`

JOB = "leaks"


def secret_values(secrets_dir: Path) -> dict[str, str]:
    """Every secret value in the folder, by file (a credentials file's password; user names,
    which are not secret, left out)."""
    out = {}
    for key in sorted((secrets_dir / "tls").glob("*.key")):  # a key's longest base64 line
        out[f"tls/{key.name}"] = max(key.read_text().splitlines(), key=len)
    for f in sorted(secrets_dir.iterdir()):
        if f.is_dir():
            continue
        text = f.read_text().strip()
        try:
            doc: Any = json.loads(text)
        except ValueError:
            doc = text
        if isinstance(doc, dict):
            out[f.name] = str(doc["password"])
        elif not f.name.endswith("-user"):
            out[f.name] = text
    assert all(len(v) >= 16 for v in out.values()), "secrets are long random strings"
    return out


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.PlatformState]:
    state_dir = tmp_path_factory.mktemp("no-leaks") / "state"
    with running_platform(
        state_dir, "--with", "all", env=any_ports_env(), timeout=300, tls=True
    ) as st:
        assert st.tls and (state_dir / "secrets" / "tls" / "runtime.key").is_file()
        yield st


def test_a_query_loads_a_round_into_a_cache_function_with_minted_credentials(
    platform: state.PlatformState,
) -> None:
    secrets = Path(platform.state_dir) / "secrets"
    ctx = Context.of(platform)  # fedfaas's own certificate: the cache engine requires one
    url, verify = {name: ctx.url(name) for name in platform.ports}, ctx.verify()
    root = MinioColdStore(
        f"{platform.host}:{platform.ports['minio']}",
        credentials.read(secrets, credentials.MINIO_USER),
        credentials.read(secrets, credentials.MINIO_PASSWORD),
    )
    write_history(root, JOB, 1, per_round=4, pool=8, shapes={"w": (8, 4)}, malicious=["c001"])
    service = {"Authorization": f"Bearer {credentials.read(secrets, credentials.SERVICE_TOKEN)}"}
    for rnd in (0, 1):
        r = httpx.post(
            f"{url['cache_engine']}/v1/jobs/{JOB}/rounds/{rnd}/complete",
            headers=service,
            timeout=120,
            verify=verify,
        )
        assert r.status_code < 300, r.text
    analyst = {"Authorization": f"Bearer {credentials.read(secrets, credentials.ANALYST_TOKEN)}"}
    r = httpx.post(
        f"{url['request_tracker']}/v1/queries",
        params={"wait": "true"},
        json={
            "workload": "cosine-to-aggregate",
            "job": JOB,
            "rounds": [1],
            "params": {"bottom_k": 1},
        },
        headers=analyst,
        timeout=180,
        verify=verify,
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done", r.text
    assert r.json()["result"]["flagged"] == ["c001"]  # the data came through the grant


def test_the_runtime_shows_no_secret_in_any_function(platform: state.PlatformState) -> None:
    secrets = secret_values(Path(platform.state_dir) / "secrets")
    ctx = Context.of(platform)
    r = httpx.get(
        f"{ctx.url('runtime')}/system/functions",
        auth=credentials.basic_auth(Path(platform.state_dir) / "secrets"),
        timeout=10,
        verify=ctx.verify(),
    )
    r.raise_for_status()
    functions = r.json()
    assert any(f["name"].startswith("flstore-cache-") for f in functions), "a cache function"
    for f in functions:
        values = [
            *(f.get("envVars") or {}).values(),
            *(f.get("labels") or {}).values(),
            *(f.get("annotations") or {}).values(),
        ]
        for name, secret in secrets.items():
            shown = any(secret in str(v) for v in values)  # a failure never shows the secret
            assert not shown, f"{name} in {f['name']}"
        assert not any("MINIO_ACCESS_KEY" in k or "SECRET" in k for k in f.get("envVars") or {})


def test_no_process_has_a_secret_on_its_command_line_or_in_its_environment(
    platform: state.PlatformState,
) -> None:
    secrets = secret_values(Path(platform.state_dir) / "secrets")
    pids = platform_processes(platform)
    names = set()
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # the program's name (redis-server sets its title to "redis-server HOST:PORT")
        names.add(cmdline.split(b"\0")[0].split()[0].rsplit(b"/", 1)[-1].decode())
        for name, secret in secrets.items():
            # booleans: a failure names the file, never shows the secret
            on_argv, in_env = secret.encode() in cmdline, secret.encode() in environ
            assert not on_argv, f"{name} on the command line of {pid}"
            assert not in_env, f"{name} in the environment of {pid}"
    # the platform's own parts were among them: MinIO, Redis, the Python services
    assert {"minio", "redis-server"} <= names, names
    assert len(pids) >= 8, f"only {len(pids)} processes of the platform found"
