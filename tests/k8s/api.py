"""A small client of a Kubernetes API server for the tests: discovery (kind -> resource),
get, list, create, merge-patch and delete of any object, authenticated with a client
certificate, every request made from inside the cluster's namespace
(:meth:`tests.k8s.netns.PrivateNamespace.call`)."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tests.k8s.netns import PrivateNamespace
from tests.k8s.pki import KeyPair


class ApiError(AssertionError):
    """The API server refused a request; the message is its answer (a Status object)."""


@dataclass(frozen=True)
class Resource:
    """Where objects of one kind live: ``/api/v1`` or ``/apis/GROUP/VERSION``, its plural."""

    prefix: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{self.prefix}{ns}/{self.plural}" + (f"/{name}" if name else "")


def conditions(obj: dict[str, Any] | None) -> dict[str, str]:
    """The conditions of ``obj``'s status, type -> status ("True", "False", "Unknown"); empty
    for None, or an object with no status or no conditions yet. The API server sends a fresh
    CustomResourceDefinition with ``"conditions": null`` until its controllers have looked at
    it (a missing key and a null one are both "none yet")."""
    status = (obj or {}).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


#: answers after which a request is sent again: 429 for any method (the server's priority and
#: fairness turned it away before doing anything), and for reads the 5xx a busy server gives
#: while its etcd is slow (500 "etcdserver: request timed out", 503, 504); a write that got a
#: 5xx may have been done, so it is not sent twice
AGAIN_ANY = frozenset({429})
AGAIN_READ = frozenset({500, 502, 503, 504})
#: sends of one request at most; the waits between them double from 0.25 s (7.75 s in all)
TRIES = 6


def send_again_while_busy(
    method: str,
    send: Callable[[], httpx.Response],
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """``send()``'s answer, sent again (up to :data:`TRIES` times, waiting as the server's
    ``Retry-After`` asks, at most 5 s) while the answer is one a busy API server gives for a
    moment (:data:`AGAIN_ANY`, :data:`AGAIN_READ` for ``GET``): a test's wait reads the
    cluster for minutes on a loaded 2-core machine, and one such answer is not what it waits
    for. The last answer is returned as it is, whatever its status."""
    again = AGAIN_ANY | (AGAIN_READ if method == "GET" else frozenset())
    for attempt in range(TRIES - 1):
        r = send()
        if r.status_code not in again:
            return r
        try:
            asked = float(r.headers.get("Retry-After", ""))
        except ValueError:
            asked = 0.0
        sleep(min(max(asked, 0.25 * 2**attempt), 5.0))
    return send()  # the last try, whatever it answers


def _prefix(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


class KubeApi:
    """The API server at ``server`` (seen from inside ``ns``), as the ``client`` certificate's
    user, trusting the CA file ``ca``."""

    def __init__(self, ns: PrivateNamespace, server: str, ca: str, client: KeyPair) -> None:
        self.ns = ns
        self.server = server
        ctx = ssl.create_default_context(cafile=ca)
        ctx.load_cert_chain(str(client.cert), str(client.key))
        self._http = ns.call(httpx.Client, base_url=server, verify=ctx, timeout=30)
        self._kinds: dict[tuple[str, str], Resource] = {}

    def close(self) -> None:
        self.ns.call(self._http.close)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request, made inside the namespace; the answer, whatever its status."""
        return self.ns.call(self._http.request, method, path, **kw)

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The request, sent again while the server is busy (:func:`send_again_while_busy`):
        the way every method below talks to the server."""
        return send_again_while_busy(method, lambda: self.request(method, path, **kw))

    def _ok(self, r: httpx.Response, what: str) -> Any:
        if r.status_code >= 300:
            raise ApiError(f"{what}: {r.status_code} {r.text}")
        return r.json()

    def resource(self, api_version: str, kind: str) -> Resource:
        """The resource of ``kind`` in ``api_version``, from the server's discovery."""
        key = (api_version, kind)
        if key not in self._kinds:
            doc = self._ok(self.send("GET", _prefix(api_version)), f"discovery {api_version}")
            for res in doc["resources"]:
                if "/" not in res["name"]:  # not a subresource
                    self._kinds[(api_version, res["kind"])] = Resource(
                        _prefix(api_version), res["name"], res["namespaced"]
                    )
        if key not in self._kinds:
            raise ApiError(f"the API server serves no {kind} in {api_version}")
        return self._kinds[key]

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The object, or None where the server has none of that name."""
        r = self.send("GET", self.resource(api_version, kind).path(namespace, name))
        if r.status_code == 404:
            return None
        return self._ok(r, f"get {kind} {namespace}/{name}")  # type: ignore[no-any-return]

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """The objects of ``kind`` (in ``namespace``; matching the label ``selector``)."""
        params = {"labelSelector": selector} if selector else None
        path = self.resource(api_version, kind).path(namespace)
        doc = self._ok(self.send("GET", path, params=params), f"list {kind}")
        return list(doc["items"])

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (server-side validation and admission apply); the stored object."""
        meta = obj["metadata"]
        res = self.resource(obj["apiVersion"], obj["kind"])
        r = self.send("POST", res.path(meta.get("namespace")), json=obj)
        what = f"create {obj['kind']} {meta.get('namespace')}/{meta['name']}"
        return self._ok(r, what)  # type: ignore[no-any-return]

    def validate(self, obj: dict[str, Any]) -> None:
        """Have the server validate ``obj`` strictly without storing it: a server-side apply
        dry run with ``fieldValidation=Strict`` (an unknown or duplicate field is an error,
        where a plain create only warns and drops it; admission runs too)."""
        meta = obj["metadata"]
        res = self.resource(obj["apiVersion"], obj["kind"])
        r = self.send(
            "PATCH",
            res.path(meta.get("namespace"), meta["name"]),
            params={
                "dryRun": "All",
                "fieldValidation": "Strict",
                "fieldManager": "fedfaas-tests",
                "force": "true",  # an object that exists (helm's) is validated, not contested
            },
            json=obj,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        self._ok(r, f"strict validation of {obj['kind']} {meta.get('namespace')}/{meta['name']}")

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of the object; the stored object."""
        r = self.send(
            "PATCH",
            self.resource(api_version, kind).path(namespace, name),
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return self._ok(r, f"patch {kind} {namespace}/{name}")  # type: ignore[no-any-return]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete the object (foreground: its dependents go first); False if it was not there."""
        r = self.send(
            "DELETE",
            self.resource(api_version, kind).path(namespace, name),
            json={"propagationPolicy": "Foreground"},
        )
        if r.status_code == 404:
            return False
        self._ok(r, f"delete {kind} {namespace}/{name}")
        return True

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token of the service account (the TokenRequest API, as kubelet gets one for a
        pod's projected token)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        doc = self._ok(self.send("POST", path, json=body), f"token of {namespace}/{name}")
        return str(doc["status"]["token"])
