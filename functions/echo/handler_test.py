from types import SimpleNamespace

from .handler import handle


class _Query(dict):
    def to_dict(self):
        return dict(self)


def _event(method, body=b"", headers=None, path="/"):
    return SimpleNamespace(
        body=body, headers=headers or {}, method=method, query=_Query(), path=path
    )


def test_post_body_comes_back_byte_for_byte_with_its_content_type():
    body = bytes(range(256)) * 4
    res = handle(
        _event("POST", body, {"Content-Type": "application/x-test"}), SimpleNamespace(hostname="h")
    )
    assert res["body"] == body
    assert res["headers"]["Content-Type"] == "application/x-test"


def test_get_reports_the_replica_that_answered():
    res = handle(_event("GET", path="/who"), SimpleNamespace(hostname="echo-0"))
    assert res["body"]["hostname"] == "echo-0"
    assert res["body"]["path"] == "/who"
