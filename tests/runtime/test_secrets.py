"""OpenFaaS secrets on the embedded runtime: the API (and the real faas-cli), the files a
function's replicas see, and the function token every FedFaaS function requires."""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from runtime import RuntimeProcess
from tests.openfaas.conftest import require_binary
from tests.polling import wait_until
from tests.runtime.conftest import (
    FN_AUTH,
    FUNCTION_TOKEN,
    PASSWORD,
    REPO,
    STACK,
    USER,
    available,
    client,
    echo_body,
)

pytestmark = pytest.mark.integration

TOKEN = "fedfaas-function-token"

# lists the secrets folder it was given and the content of each file
LISTER = """
import os


def handle(event, context):
    d = os.environ["FEDFAAS_SECRETS_DIR"]
    files = {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))}
    modes = {n: oct(os.stat(os.path.join(d, n)).st_mode & 0o777) for n in files}
    return {"body": {"dir": d, "files": files, "modes": modes}}
"""


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _delete(http: httpx.Client, name: str) -> httpx.Response:
    return http.request("DELETE", "/system/secrets", json={"name": name})


def _remove_function(http: httpx.Client, name: str) -> None:
    r = http.request("DELETE", "/system/functions", json={"functionName": name})
    assert r.status_code == 202


def test_secret_crud_lists_names_only_and_stores_private_files(
    http: httpx.Client, runtime: RuntimeProcess
) -> None:
    r = http.post("/system/secrets", json={"name": "crud-a", "value": "alpha"})
    assert r.status_code == 202
    raw = base64.b64encode(b"\x00\xffbin").decode()
    assert http.post("/system/secrets", json={"name": "crud-b", "rawValue": raw}).status_code == 202
    listed = http.get("/system/secrets").json()
    assert {"name": "crud-a", "namespace": "openfaas-fn"} in listed
    assert {"name": TOKEN, "namespace": "openfaas-fn"} in listed
    assert all(set(s) == {"name", "namespace"} for s in listed)  # never a value
    assert "alpha" not in http.get("/system/secrets").text

    folder = runtime.state_dir / "secrets"
    assert _mode(folder) == 0o700
    assert _mode(folder / "crud-a") == 0o600 and (folder / "crud-a").read_text() == "alpha"
    assert (folder / "crud-b").read_bytes() == b"\x00\xffbin"
    both = {"name": "crud-c", "value": "text", "rawValue": base64.b64encode(b"raw").decode()}
    assert http.post("/system/secrets", json=both).status_code == 202
    assert (folder / "crud-c").read_bytes() == b"raw"  # rawValue wins, as in faas-netes
    assert _delete(http, "crud-c").status_code == 202

    r = http.post("/system/secrets", json={"name": "crud-a", "value": "again"})
    assert r.status_code == 409 and r.json()["error"] == "secret_exists"
    assert http.put("/system/secrets", json={"name": "crud-a", "value": "beta"}).status_code == 202
    assert (folder / "crud-a").read_text() == "beta"
    assert _mode(folder / "crud-a") == 0o600
    r = http.put("/system/secrets", json={"name": "ghost", "value": "x"})
    assert r.status_code == 404 and r.json()["error"] == "secret_not_found"

    assert _delete(http, "crud-a").status_code == 202
    assert _delete(http, "crud-b").status_code == 202
    r = _delete(http, "crud-a")
    assert r.status_code == 404 and r.json()["error"] == "secret_not_found"
    assert not (folder / "crud-a").exists()
    assert "crud-a" not in {s["name"] for s in http.get("/system/secrets").json()}


@pytest.mark.parametrize(
    ("method", "body", "says"),
    [
        ("POST", {"name": "Bad_Name", "value": "x"}, "invalid secret name"),
        ("POST", {"name": "../escape", "value": "x"}, "invalid secret name"),
        ("POST", {"name": "a" * 254, "value": "x"}, "invalid secret name"),
        ("POST", {"value": "x"}, "secret name is required"),
        ("POST", {"name": "empty-value"}, "non-empty value"),
        ("POST", {"name": "bad-raw", "rawValue": "%%%"}, "base64"),
        ("POST", {"name": "bad-type", "value": 5}, "value"),
        ("POST", {"name": "other-ns", "value": "x", "namespace": "kube-system"}, "namespace"),
        ("PUT", {"name": "Bad_Name", "value": "x"}, "invalid secret name"),
        ("DELETE", {"name": "Bad_Name"}, "invalid secret name"),
    ],
)
def test_bad_secret_requests_get_400_json(
    http: httpx.Client, method: str, body: dict[str, object], says: str
) -> None:
    r = http.request(method, "/system/secrets", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] in ("invalid_request", "wrong_namespace")
    assert says in r.json()["detail"]


def test_bad_secret_json_gets_400(http: httpx.Client) -> None:
    for raw in (b"", b"{not json", b"[1, 2]"):
        r = http.post("/system/secrets", content=raw)
        assert r.status_code == 400 and r.json()["error"] == "invalid_request", raw


def test_replicas_see_exactly_their_secrets_refreshed_on_update_and_redeploy(
    http: httpx.Client, runtime: RuntimeProcess, tmp_path: Path
) -> None:
    (tmp_path / "handler.py").write_text(LISTER)
    for name, value in (("mount-a", "A1"), ("mount-b", "B1"), ("mount-c", "C1")):
        assert http.post("/system/secrets", json={"name": name, "value": value}).status_code == 202
    annotations = {"com.fedfaas.handler": str(tmp_path)}

    # an unknown secret refuses the deployment, naming it
    body = echo_body("lister", annotations=annotations, secrets=[TOKEN, "mount-a", "nope"])
    r = http.post("/system/functions", json=body)
    assert r.status_code == 400 and "secret(s) not found: nope" in r.json()["detail"]

    body = echo_body("lister", annotations=annotations, secrets=[TOKEN, "mount-a", "mount-b"])
    assert http.post("/system/functions", json=body).status_code == 202
    wait_until(lambda: available(http, "lister") == 1)
    seen = http.get("/function/lister").json()
    assert seen["files"] == {TOKEN: FUNCTION_TOKEN, "mount-a": "A1", "mount-b": "B1"}
    assert set(seen["modes"].values()) == {"0o600"}
    folder = Path(seen["dir"])
    assert _mode(folder) == 0o700 and folder.is_relative_to(runtime.state_dir)

    # a secret in use cannot be removed; the answer names the function
    r = _delete(http, "mount-a")
    assert r.status_code == 409 and r.json()["error"] == "secret_in_use"
    assert "lister" in r.json()["detail"]

    # update: the running replica reads the new value
    assert http.put("/system/secrets", json={"name": "mount-a", "value": "A2"}).status_code == 202
    assert http.get("/function/lister").json()["files"]["mount-a"] == "A2"

    # redeploy with another list: exactly the new set
    body["secrets"] = [TOKEN, "mount-c"]
    assert http.put("/system/functions", json=body).status_code == 202
    wait_until(lambda: set(http.get("/function/lister").json()["files"]) == {TOKEN, "mount-c"})
    assert _delete(http, "mount-a").status_code == 202  # no longer used

    _remove_function(http, "lister")
    assert not folder.exists()
    for name in ("mount-b", "mount-c"):
        assert _delete(http, name).status_code == 202


def test_function_without_the_token_secret_refuses_to_start(
    http: httpx.Client, runtime: RuntimeProcess
) -> None:
    body = echo_body("tokenless")
    body.pop("secrets")
    assert http.post("/system/functions", json=body).status_code == 202
    log = runtime.state_dir / "functions" / "tokenless" / "tokenless-0.log"
    wait_until(lambda: log.exists() and "refusing to start" in log.read_text(), timeout=30)
    text = log.read_text()
    assert "no function token" in text and f"secrets: [{TOKEN}]" in text
    assert available(http, "tokenless") == 0
    assert http.post("/function/tokenless", content=b"x").status_code == 503
    _remove_function(http, "tokenless")


def test_function_token_is_checked_before_the_body_and_follows_secret_updates(
    http: httpx.Client, runtime: RuntimeProcess
) -> None:
    assert http.post("/system/functions", json=echo_body("guarded")).status_code == 202
    wait_until(lambda: available(http, "guarded") == 1)
    with httpx.Client(base_url=str(http.base_url), trust_env=False, timeout=60) as bare:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
            r = bare.post("/function/guarded", content=b"x" * (4 << 20), headers=headers)
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"] == "unauthorized" and r.json()["detail"]
        assert bare.get("/function/guarded/_/health").status_code == 200  # health stays open
        r = bare.post("/function/guarded", content=b"ok", headers=FN_AUTH)
        assert r.status_code == 200 and r.content == b"ok"
        # a new token value reaches the running replica
        new = {"Authorization": "Bearer rotated-token-value"}
        update = {"name": TOKEN, "value": "rotated-token-value"}
        assert http.put("/system/secrets", json=update).status_code == 202
        try:
            assert bare.post("/function/guarded", content=b"x", headers=FN_AUTH).status_code == 401
            assert bare.post("/function/guarded", content=b"x", headers=new).status_code == 200
            # the file gone from under a running replica: it fails closed
            (runtime.state_dir / "function-secrets" / "guarded" / TOKEN).unlink()
            r = bare.post("/function/guarded", content=b"x", headers=new)
            assert r.status_code == 503 and r.json()["error"] == "no_function_token"
        finally:
            update["value"] = FUNCTION_TOKEN
            assert http.put("/system/secrets", json=update).status_code == 202
    _remove_function(http, "guarded")


def test_secrets_survive_a_runtime_restart_and_functions_do_not(tmp_path: Path) -> None:
    for attempt in (1, 2):
        rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt").start()
        try:
            with client(rt) as http:
                if attempt == 1:
                    secret = {"name": "kept", "value": "v"}
                    assert http.post("/system/secrets", json=secret).status_code == 202
                    body = echo_body("gone", secrets=["kept"])
                    body["annotations"] = {"com.fedfaas.handler": str(REPO / "functions/echo")}
                    assert http.post("/system/functions", json=body).status_code == 202
                else:
                    assert http.get("/system/secrets").json() == [
                        {"name": "kept", "namespace": "openfaas-fn"}
                    ]
                    assert http.get("/system/functions").json() == []
                    assert list((tmp_path / "rt" / "function-secrets").iterdir()) == []
        finally:
            rt.stop()


def _faas_cli() -> Path:
    """The real faas-cli: ``$FEDFAAS_OPENFAAS_BIN``, ``../shared/openfaas/bin`` or PATH; else the
    test skips, or fails under CI (:func:`tests.openfaas.conftest.require_binary`)."""
    for folder in (os.environ.get("FEDFAAS_OPENFAAS_BIN"), REPO.parent / "shared/openfaas/bin"):
        if folder and (Path(folder) / "faas-cli").is_file():
            return Path(folder) / "faas-cli"
    found = shutil.which("faas-cli")
    return Path(found) if found else require_binary("faas-cli")


def test_real_faas_cli_secret_create_list_update_remove_and_invoke_with_the_token(
    auth_runtime: RuntimeProcess, tmp_path: Path
) -> None:
    cli = _faas_cli()
    # faas-cli keeps its login in ~/.openfaas, but in ./.openfaas (here: the repo) when CI is
    # set; OPENFAAS_CONFIG names its folder either way
    env = {**os.environ, "HOME": str(tmp_path), "OPENFAAS_CONFIG": str(tmp_path / ".openfaas")}

    def faas(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cli), *args, "--gateway", auth_runtime.url],
            capture_output=True,
            text=True,
            env=env,
            input=stdin,
            timeout=60,
        )

    before_login = faas("secret", "list")
    assert before_login.returncode != 0 and "unauthorized" in before_login.stdout.lower()
    assert faas("login", "-u", USER, "--password-stdin", stdin=PASSWORD).returncode == 0
    folder = auth_runtime.state_dir / "secrets"

    out = faas("secret", "create", "cli-key", "--from-literal", "v1")
    assert out.returncode == 0 and "202" in out.stdout, out
    (tmp_path / "value").write_text("from-a-file")
    out = faas("secret", "create", "cli-file", "--from-file", str(tmp_path / "value"))
    assert out.returncode == 0 and (folder / "cli-file").read_text() == "from-a-file"
    assert "already exists" in faas("secret", "create", "cli-key", "--from-literal", "v1").stdout

    listed = faas("secret", "list").stdout.split()
    assert {"cli-key", "cli-file", TOKEN} <= set(listed) and "v1" not in listed

    out = faas("secret", "update", "cli-key", "--from-literal", "v2")
    assert out.returncode == 0 and (folder / "cli-key").read_text() == "v2"
    assert (
        "unable to find secret" in faas("secret", "update", "ghost", "--from-literal", "x").stdout
    )

    # a secret a function uses is refused (409); deploy echo, which lists the token secret
    with httpx.Client(base_url=auth_runtime.url, auth=(USER, PASSWORD), trust_env=False) as http:
        assert http.post("/system/functions", json=echo_body("cli-user")).status_code == 202
        wait_until(lambda: available(http, "cli-user") == 1)
        # faas-cli invoke passes the function token with -H
        out = faas("invoke", "cli-user", stdin="hello")
        assert out.returncode != 0 and "401" in out.stdout + out.stderr, out
        out = faas(
            "invoke", "cli-user", "-H", f"Authorization: Bearer {FUNCTION_TOKEN}", stdin="hi"
        )
        assert out.returncode == 0 and out.stdout == "hi", out
        out = faas("secret", "remove", TOKEN)
        assert out.returncode != 0 and "409" in out.stdout + out.stderr, out
        assert (folder / TOKEN).exists()
        _remove_function(http, "cli-user")

    for name in ("cli-key", "cli-file"):
        out = faas("secret", "remove", name)
        assert out.returncode == 0 and not (folder / name).exists(), out
    assert faas("secret", "remove", "cli-key").returncode != 0
    assert {"cli-key", "cli-file"}.isdisjoint(faas("secret", "list").stdout.split())
