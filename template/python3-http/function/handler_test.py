from types import SimpleNamespace

from .handler import handle


def test_handle_returns_the_body():
    event = SimpleNamespace(body=b"\x00\x01", headers={}, method="POST", query={}, path="/")
    assert handle(event, SimpleNamespace(hostname="localhost"))["body"] == b"\x00\x01"
