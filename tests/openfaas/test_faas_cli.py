"""The whole faas-cli user sequence, with OpenFaaS's own faas-cli, against the embedded runtime:
login, version, namespaces, secrets (create from a literal and from a file, list, update,
remove refused while in use), deploy -f, list, describe, ready, diff, invoke (binary bodies
byte-identical, the function token passed with -H), logs, a function reading a secret faas-cli
created, remove, logout; and namespace management (a Pro feature) answering 501."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from runtime import RuntimeProcess
from tests.openfaas.conftest import FaasCli, text, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOKEN_SECRET = "fedfaas-function-token"
TOKEN = "conformance-function-token-0123456789"
READER_DIR = Path(__file__).resolve().parent / "secret_reader"
ECHO_DIR = REPO / "functions" / "echo"

STACK = f"""\
version: 1.0
provider:
  name: openfaas
functions:
  conform-echo:
    lang: python3-http
    handler: {ECHO_DIR}
    image: fedfaas-conformance/echo:0.1.0
    secrets:
      - {TOKEN_SECRET}
    labels:
      com.openfaas.scale.max: "3"
    annotations:
      com.fedfaas.handler: {ECHO_DIR}
    limits:
      memory: 256Mi
  conform-reader:
    lang: python3-http
    handler: {READER_DIR}
    image: fedfaas-conformance/secret-reader:0.1.0
    environment:
      GREETING: hello
    secrets:
      - {TOKEN_SECRET}
      - conform-literal
      - conform-file
    annotations:
      com.fedfaas.handler: {READER_DIR}
"""

#: every faas-cli command the sequence runs
SEQUENCE_COMMANDS = {
    "login", "version", "namespace list", "namespaces", "secret create", "secret list",
    "secret update", "secret remove", "deploy", "ready", "list", "describe", "diff", "invoke",
    "logs", "remove", "logout",
}  # fmt: skip

BEARER = ("-H", f"Authorization: Bearer {TOKEN}")


def test_faas_cli_user_sequence(
    faas_cli: FaasCli, openfaas_runtime: RuntimeProcess, tmp_path: Path
) -> None:
    rt = openfaas_runtime
    faas_cli.gateway = rt.url
    user, password = rt.auth
    stack = tmp_path / "stack.yml"
    stack.write_text(STACK)
    secrets = rt.state_dir / "secrets"

    # without a login: refused, asking for one
    out = faas_cli("list")
    assert out.returncode != 0 and "faas-cli login" in text(out.stdout + out.stderr)
    bad = faas_cli("login", "-u", user, "--password-stdin", stdin="wrong-password")
    assert bad.returncode != 0
    assert not (faas_cli.home / ".openfaas" / "config.yml").exists()
    said = faas_cli.ok("login", "-u", user, "--password-stdin", stdin=password)
    assert "credentials saved" in said
    # faas-cli keeps the login in the config of this test's own HOME
    assert (faas_cli.home / ".openfaas" / "config.yml").is_file()

    # version: the server part comes from /system/info (no update check: there is no internet)
    version = faas_cli.ok("version", "--warn-update=false")
    assert re.search(r"Gateway\s+uri:\s+" + re.escape(rt.url), version), version
    assert re.search(r"Provider\s+name:\s+fedfaas-runtime\s+orchestration:\s+process", version)

    assert "- openfaas-fn" in faas_cli.ok("namespace", "list")
    assert "- openfaas-fn" in faas_cli.ok("namespaces")  # the deprecated spelling still works

    # secrets: from a file (the function token) and from a literal; names listed, never values
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    assert "202" in faas_cli.ok(
        "secret", "create", TOKEN_SECRET, "--from-file", str(tmp_path / "token")
    )
    assert "202" in faas_cli.ok("secret", "create", "conform-literal", "--from-literal", "lit-v1")
    (tmp_path / "value.bin").write_bytes(b"\x00\x01file-value\xff")
    faas_cli.ok("secret", "create", "conform-file", "--from-file", str(tmp_path / "value.bin"))
    listed = faas_cli.ok("secret", "list").split()
    assert {TOKEN_SECRET, "conform-literal", "conform-file"} <= set(listed)
    assert "lit-v1" not in listed and TOKEN not in listed
    assert (secrets / TOKEN_SECRET).read_text() == TOKEN
    assert "202" in faas_cli.ok("secret", "update", "conform-literal", "--from-literal", "lit-v2")
    assert (secrets / "conform-literal").read_text() == "lit-v2"
    # from STDIN, trimmed unless --trim=false
    faas_cli.ok("secret", "create", "conform-stdin", stdin=" piped \n")
    assert (secrets / "conform-stdin").read_text() == "piped"
    faas_cli.ok("secret", "update", "conform-stdin", "--trim=false", stdin=" piped \n")
    assert (secrets / "conform-stdin").read_text() == " piped \n"
    faas_cli.ok("secret", "remove", "conform-stdin")

    # deploy from the stack file; ready; list; describe
    # from the repo folder, as a user does: faas-cli reads the fprocess of each function's
    # template from ./template/<lang>/template.yml (describe shows it below)
    deployed = faas_cli.ok("deploy", "-f", str(stack), cwd=REPO)
    assert deployed.count("Deployed. 202 Accepted.") == 2, deployed
    assert f"URL: {rt.url}/function/conform-echo" in deployed
    for name in ("conform-echo", "conform-reader"):
        assert f"Function {name} is ready" in faas_cli.ok(
            "ready", name, "--interval", "200ms", "--attempts", "300"
        )
    assert "gateway is ready" in faas_cli.ok("ready")

    rows = {line.split()[0]: line.split() for line in faas_cli.ok("list").splitlines()[1:]}
    assert rows["conform-echo"][1:] == ["0", "1"]  # invocations, replicas
    assert set(rows) == {"conform-echo", "conform-reader"}
    verbose = faas_cli.ok("list", "-v")
    assert re.search(r"conform-echo\s+fedfaas-conformance/echo:0.1.0\s+0\s+1\s+\d{4}-", verbose)

    described = faas_cli.ok("describe", "conform-reader")
    for want in (
        r"Name:\s+conform-reader",
        r"Status:\s+Ready",
        r"Available Replicas:\s+1",
        r"Image:\s+fedfaas-conformance/secret-reader:0.1.0",
        r"Function Process:\s+python index.py",
        rf"URL:\s+{re.escape(rt.url)}/function/conform-reader",
        r"faas_function: conform-reader",
        r"GREETING: hello",
        r"- conform-literal",
        r"- conform-file",
    ):
        assert re.search(want, described), (want, described)

    # --json: what faas-cli decoded from the runtime's FunctionStatus
    as_json = {f["name"]: f for f in json.loads(faas_cli.ok("list", "--json"))}
    assert as_json["conform-reader"]["envVars"] == {"GREETING": "hello"}
    assert as_json["conform-reader"]["secrets"] == [TOKEN_SECRET, "conform-literal", "conform-file"]
    assert as_json["conform-echo"]["limits"] == {"memory": "256Mi"}
    one = json.loads(faas_cli.ok("describe", "conform-echo", "--json"))
    assert one["Status"] == "Ready" and one["URL"] == f"{rt.url}/function/conform-echo"

    # deploying again updates in place (PUT): the new environment is there, ready again
    faas_cli.ok("deploy", "-f", str(stack), "--filter", "conform-echo", "--env", "X=2", cwd=REPO)
    faas_cli.ok("ready", "conform-echo", "--interval", "200ms", "--attempts", "300")
    assert re.search(r"Environment:\n X: 2\n", faas_cli.ok("describe", "conform-echo"))

    # diff: everything the stack file says is deployed as said; the runtime adds only what
    # faas-netes adds to every function (the faas_function label, prometheus.io.scrape)
    out = faas_cli("diff", "-f", str(stack))
    rows_of_diff = [line for line in text(out.stdout).splitlines() if " | " in line]
    changes = [r for r in rows_of_diff if re.search(r"[-+] \S+:", r)]
    assert all(r.split(" | ")[0].strip() == "" for r in changes), changes  # nothing missing
    added = {re.search(r"\+ (\S+):", r).group(1) for r in changes}  # type: ignore[union-attr]
    assert added == {"label.faas_function", "annotation.prometheus.io.scrape"}, text(out.stdout)

    # invoke: the function token with -H ("Key: Value"; the deprecated "Key=Value" too); bodies
    # come back byte for byte, binary ones included
    out = faas_cli("invoke", "conform-echo", stdin=b"no token")
    assert out.returncode != 0 and "401" in text(out.stdout + out.stderr)
    body = bytes(range(256)) * 64 + b"\r\n\x00end"
    out = faas_cli(
        "invoke", "conform-echo", *BEARER, "--content-type", "application/x-raw", stdin=body
    )
    assert out.returncode == 0 and out.stdout == body, out.stderr
    out = faas_cli(
        "invoke", "conform-echo", "-H", f"Authorization=Bearer {TOKEN}", stdin=b"\xff\xfe old"
    )
    assert out.returncode == 0 and out.stdout == b"\xff\xfe old", out.stderr
    # --method and --query reach the function (echo answers a GET with what it saw)
    got = json.loads(faas_cli.ok("invoke", "conform-echo", *BEARER, "-m", "GET", "--query", "q=1"))
    assert got["function"] == "conform-echo" and got["query"] == {"q": "1"}, got
    described = faas_cli.ok("describe", "conform-echo")
    # four calls, the one refused 401 included: OpenFaaS counts invocations of every status code
    assert re.search(r"Invocations:\s+4\n", described), described

    # the function reads the secrets faas-cli created, updated values included
    read = faas_cli("invoke", "conform-reader", *BEARER, stdin=b"conform-literal")
    assert read.returncode == 0 and read.stdout == b"lit-v2", read
    read = faas_cli("invoke", "conform-reader", *BEARER, stdin=b"conform-file")
    assert read.returncode == 0 and read.stdout == b"\x00\x01file-value\xff", read
    faas_cli.ok("secret", "update", "conform-literal", "--from-literal", "lit-v3")
    read = faas_cli("invoke", "conform-reader", *BEARER, stdin=b"conform-literal")
    assert read.stdout == b"lit-v3", read

    # logs: the line the function printed, and the replica's start line
    def logged() -> bool:
        out = faas_cli("logs", "conform-reader", "--tail=false")
        return out.returncode == 0 and "secret-reader: reading conform-file" in text(out.stdout)

    wait_for(logged, "faas-cli logs shows the function's own line")
    shown = faas_cli.ok("logs", "conform-reader", "--tail=false", "--instance", "--name")
    assert re.search(r"conform-reader \(conform-reader-0\) .*listening", shown), shown

    # a secret in use is refused (409, naming the user); removing the function frees it
    out = faas_cli("secret", "remove", "conform-literal")
    said = text(out.stdout + out.stderr)
    assert out.returncode != 0 and "409" in said and "conform-reader" in said, said
    assert (secrets / "conform-literal").exists()
    assert "Deleting: conform-reader." in faas_cli.ok("remove", "conform-reader")
    wait_for(lambda: "conform-reader" not in faas_cli.ok("list"), "conform-reader removed")
    for name in ("conform-literal", "conform-file"):
        faas_cli.ok("secret", "remove", name)
        assert not (secrets / name).exists()
    assert {"conform-literal", "conform-file"}.isdisjoint(faas_cli.ok("secret", "list").split())

    # remove -f: every function of the stack file
    faas_cli.ok("remove", "-f", str(stack))
    wait_for(lambda: len(faas_cli.ok("list").splitlines()) == 1, "no functions left")
    with httpx.Client(base_url=rt.url, auth=rt.auth, trust_env=False) as http:
        assert http.get("/system/functions").json() == []
    out = faas_cli("invoke", "conform-echo", *BEARER, stdin=b"gone")
    assert out.returncode != 0 and "404" in text(out.stdout + out.stderr)

    # logout: the saved credentials are gone, and faas-cli is refused again
    faas_cli.ok("logout")
    out = faas_cli("list")
    assert out.returncode != 0 and "faas-cli login" in text(out.stdout + out.stderr)

    assert faas_cli.commands == SEQUENCE_COMMANDS


NAMESPACE_COMMANDS = [
    pytest.param(("namespace", "get", "openfaas-fn"), id="get"),
    pytest.param(("namespace", "update", "openfaas-fn", "--label", "team=fl"), id="update"),
    pytest.param(("namespace", "delete", "conform-ns"), id="delete"),
    pytest.param(("namespace", "create", "conform-ns"), id="create"),
]


@pytest.mark.parametrize("command", NAMESPACE_COMMANDS)
def test_faas_cli_namespace_management_is_not_implemented(
    faas_cli: FaasCli, openfaas_runtime: RuntimeProcess, command: tuple[str, ...]
) -> None:
    """Namespace management (an OpenFaaS Pro feature) answers 501 as the CE provider does."""
    faas_cli.gateway = openfaas_runtime.url
    user, password = openfaas_runtime.auth
    faas_cli.ok("login", "-u", user, "--password-stdin", stdin=password)
    out = faas_cli(*command)
    said = text(out.stdout + out.stderr)
    assert out.returncode != 0 and "501" in said and "not_implemented" in said, said
    assert "- openfaas-fn" in faas_cli.ok("namespace", "list")  # nothing changed
