"""The aggregator function's HTTP contract: status on GET, a clear 405 for anything else."""

import os
from types import SimpleNamespace

from .handler import handle


def _event(method, body=b""):
    return SimpleNamespace(method=method, body=body, headers={}, query={}, path="/")


def test_get_reports_this_replicas_endpoints():
    res = handle(_event("GET"), SimpleNamespace(hostname="agg-0"))
    assert res["statusCode"] == 200 and res["body"]["pid"] == os.getpid()
    assert isinstance(res["body"]["endpoints"], list)


def test_work_is_never_taken_over_http():
    for body in (b'{"action": "attach", "socket": "/tmp/x", "job_id": 1}', b"{not json"):
        res = handle(_event("POST", body), None)
        assert res["statusCode"] == 405
        assert res["body"]["error"] == "method_not_allowed" and res["body"]["detail"]
