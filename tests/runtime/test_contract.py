"""Unit tests: the python3-http contract (event objects, return-value rules, durations)."""

from __future__ import annotations

import json

import pytest

from runtime.contract import BadResult, Headers, Query, to_response
from runtime.watchdog import parse_duration


def _body(result: object) -> bytes:
    body = to_response(result)[2]
    return body if isinstance(body, bytes) else b"".join(body)


def _ctype(result: object) -> str:
    return dict((k.lower(), v) for k, v in to_response(result)[1])["content-type"]


def test_none_is_an_empty_200() -> None:
    assert to_response(None)[0] == 200 and _body(None) == b""


def test_dict_body_is_json_and_status_and_headers_are_used() -> None:
    res = {"statusCode": 201, "body": {"b": 1, "a": [1, 2]}, "headers": {"X-A": "1"}}
    status, headers, body = to_response(res)
    assert status == 201 and ("X-A", "1") in headers
    assert json.loads(body) == {"a": [1, 2], "b": 1}  # type: ignore[arg-type]
    assert _ctype(res) == "application/json"


def test_bytes_body_is_returned_intact_not_as_its_repr() -> None:
    data = bytes(range(256))
    assert _body({"body": data}) == data
    assert _ctype({"body": data}) == "application/octet-stream"
    assert _body({"body": data, "headers": [("Content-type", "image/png")]}) == data
    assert _ctype({"body": data, "headers": [("Content-type", "image/png")]}) == "image/png"


def test_other_bodies_become_str_as_html() -> None:
    assert _body({"body": 42}) == b"42"
    assert _ctype({"body": "hi"}) == "text/html; charset=utf-8"
    assert _body({"statusCode": 204}) == b""


def test_non_dict_results_follow_flask() -> None:
    assert to_response(("made", 201))[0] == 201
    status, headers, body = to_response(("x", 202, {"X-B": "2"}))
    assert status == 202 and ("X-B", "2") in headers and body == b"x"
    assert to_response(b"\x00")[2] == b"\x00"
    assert _body(iter([b"a", "b"])) == b"ab"
    with pytest.raises(BadResult):
        to_response(3.5)


def test_headers_are_case_insensitive_and_query_is_multi_valued() -> None:
    h = Headers([("Content-Type", "a/b"), ("X-Many", "1"), ("x-many", "2")])
    assert h["content-type"] == "a/b" and "CONTENT-TYPE" in h and h.get("nope") is None
    assert h.getlist("X-MANY") == ["1", "2"]
    q = Query(b"a=1&a=2&b=")
    assert q["a"] == "1" and q.getlist("a") == ["1", "2"] and q.to_dict() == {"a": "1", "b": ""}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("1m30s", 90), ("500ms", 0.5), ("45", 45), ("1h", 3600), ("", 7)],
)
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text, 7) == pytest.approx(seconds)


def test_bad_duration_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_duration("10 minutes", 1)
