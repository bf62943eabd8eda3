"""Typed errors (client.errors): every code the platform's services answer maps to one class.

The codes are read from the servers' sources (the node gateway, the control plane, FLStore's
tracker, cache engine and cache functions, the shared auth layer and wire format), so a code a
service starts answering fails here until the SDK names its class.
"""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

from client import errors
from client.errors import (
    CODES,
    ClientError,
    GatewayUnavailable,
    JobFailed,
    JobNotFound,
    QueryFailed,
    StaleRound,
    UpdateRejected,
    error_for,
    from_response,
    query_error,
)
from client.flstore import flstore_query

REPO = Path(__file__).resolve().parents[2]
#: where the services answering the SDK build their ``{"error": code, ...}`` bodies
SERVER_SOURCES = (
    "gateway",
    "control_plane",
    "request_tracker",
    "cache_engine",
    "functions/flstore",
    "functions/evaluator",
    "flstore_workloads",
    "core/auth.py",
    "core/wire",
)
CODE_NAMES = ("code", "error")


def _constants(node: ast.expr | None) -> list[str]:
    """String constants a code expression can take (``"x"``, ``"a" if c else "b"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value else []  # "": no code (a default meaning none)
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    return []


def _code_params(tree: ast.AST) -> dict[str, int]:
    """Functions taking a code: name -> the position of its ``code`` parameter (self counted
    out), so that positional codes in their calls are found too."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
            for name in CODE_NAMES:
                if name in names:
                    out[node.name] = names.index(name)
    return out


def _codes(tree: ast.AST, params: dict[str, int]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):  # code = "x"; status, code = 404, "x"
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in CODE_NAMES:
                    found.update(_constants(node.value))
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts, strict=False):
                        if isinstance(t, ast.Name) and t.id in CODE_NAMES:
                            found.update(_constants(v))
        elif isinstance(node, ast.Dict):  # {"error": "x", ...}
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "error":
                    found.update(_constants(v))
        elif isinstance(node, ast.Call):  # f(..., code="x"), _err(409, "x", ...)
            for kw in node.keywords:
                if kw.arg in CODE_NAMES:
                    found.update(_constants(kw.value))
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in params and len(node.args) > params[name]:
                found.update(_constants(node.args[params[name]]))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):  # code: str = "x"
            args = node.args.args[len(node.args.args) - len(node.args.defaults) :]
            pairs = [*zip(args, node.args.defaults, strict=True)]
            pairs += [*zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
            for a, d in pairs:
                if a.arg in CODE_NAMES:
                    found.update(_constants(d))
    return found


def server_codes() -> dict[str, set[str]]:
    """Every error code found in the servers' sources -> the files naming it."""
    files = []
    for where in SERVER_SOURCES:
        p = REPO / where
        files += [p] if p.is_file() else sorted(p.rglob("*.py"))
    trees = {f: ast.parse(f.read_text()) for f in files if "test" not in f.name}
    params: dict[str, int] = {}
    for tree in trees.values():
        params.update(_code_params(tree))
    out: dict[str, set[str]] = {}
    for f, tree in trees.items():
        for code in _codes(tree, params):
            out.setdefault(code, set()).add(str(f.relative_to(REPO)))
    return out


def test_the_walk_finds_the_codes_of_every_kind_of_source() -> None:
    """The walk itself: a class attribute, a keyword, a positional code of a helper, a dict
    body, a default argument and a conditional each give their code."""
    found = server_codes()
    for code, where in {
        "client_not_selected": "control_plane/errors.py",  # code = "..."
        "round_not_written": "cache_engine/errors.py",  # status, code = 404, "..."
        "wrong_node": "gateway/jobs.py",  # code="..."
        "bad_client_meta": "gateway/ingest.py",  # self._reject(detail, 400, "...")
        "bad_async": "gateway/fedbuff.py",  # declared_spec(..., "bad_async")
        "not_held": "functions/flstore/handler.py",  # _err(409, "...", ...)
        "unknown_query": "request_tracker/service.py",  # {"error": "..."}
        "bad_update": "gateway/errors.py",  # code: str = "bad_update"
        "forbidden": "core/auth.py",  # "unauthorized" if ... else "forbidden"
        "non_finite": "core/wire/errors.py",
    }.items():
        assert where in found.get(code, ()), (code, found.get(code))
    assert len(found) > 80


def test_every_code_the_platform_answers_maps_to_one_class() -> None:
    missing = {code: where for code, where in server_codes().items() if code not in CODES}
    assert not missing, f"codes the SDK has no class for (add them to a class's codes): {missing}"
    for code, cls in CODES.items():
        assert code in cls.codes and issubclass(cls, ClientError)
        assert sum(code in c.codes for c in errors._classes(ClientError)) == 1, code


@pytest.mark.parametrize("code", sorted(CODES))
def test_an_answer_with_a_code_raises_its_class_naming_status_code_and_detail(code: str) -> None:
    cls = CODES[code]
    status = 503 if issubclass(cls, GatewayUnavailable) else 409
    req = httpx.Request("POST", "http://svc/v1/x")
    resp = httpx.Response(
        status,
        json={"error": code, "detail": "what to fix", "missing": ["k"]},
        headers={"Retry-After": "2"},
        request=req,
    )
    err = from_response(resp)
    assert type(err) is cls
    assert (err.status, err.error, err.detail) == (status, code, "what to fix")
    assert (err.method, err.url, err.facts, err.retry_after) == (
        "POST",
        str(req.url),
        {"missing": ["k"]},
        2.0,
    )
    assert f"{status} {code}: what to fix" in str(err)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, errors.InvalidRequest),
        (401, errors.Unauthorized),
        (404, errors.NotFound),
        (409, errors.Conflict),
        (413, UpdateRejected),
        (502, GatewayUnavailable),
    ],
)
def test_an_unknown_code_or_a_body_without_one_falls_back_by_status(status: int, cls: type) -> None:
    assert type(error_for(status, {"error": "brand_new", "detail": "d"})) is cls
    err = error_for(status, None, text="<html>proxy error</html>")
    assert type(err) is cls and err.error == f"http_{status}" and "proxy error" in err.detail


def test_job_failed_names_its_job_and_reason_from_the_control_planes_answer() -> None:
    err = error_for(409, {"error": "job_failed", "detail": "job 'j' failed: round 2: 0 of 1"})
    assert isinstance(err, JobFailed) and isinstance(err, UpdateRejected)
    assert (err.job, err.reason) == ("j", "round 2: 0 of 1")
    made = JobFailed.of("k", "why")
    assert (made.job, made.reason, made.status, made.error) == ("k", "why", 409, "job_failed")


def test_a_refused_query_is_both_its_codes_class_and_query_failed() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "unknown_job", "detail": "no job 'j'"})

    with pytest.raises(JobNotFound) as err:
        flstore_query(
            "http://t", "oort", "j", token="t", wait=0, transport=httpx.MockTransport(refuse)
        )
    assert isinstance(err.value, QueryFailed) and err.value.query["workload"] == "oort"
    assert query_error(JobNotFound) is type(err.value)  # one class per code, made once
    assert query_error(type(err.value)) is type(err.value)


def test_no_answer_is_gateway_unavailable_unreachable() -> None:
    def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(GatewayUnavailable) as err:
        flstore_query(
            "http://t", "oort", "j", token="t", wait=0, transport=httpx.MockTransport(refused)
        )
    assert (err.value.status, err.value.error) == (0, "unreachable")
    assert isinstance(err.value, QueryFailed) and not isinstance(err.value, StaleRound)
