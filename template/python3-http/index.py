"""python3-http template server (Flask + waitress) for Docker builds run by of-watchdog.

Same contract as the embedded runtime's watchdog (runtime/contract.py): handle(event,
context); a dict result {"statusCode", "body", "headers"} with a dict body -> JSON, a bytes body
sent intact (upstream's alpine template would send "b'...'"), any other body -> str(body);
non-dict results go to Flask unchanged.

Function token (runtime.function_auth, as the embedded watchdog): every request needs
"Authorization: Bearer <token>", the token being the secret file fedfaas-function-token in
$FEDFAAS_SECRETS_DIR (default /var/openfaas/secrets, where OpenFaaS mounts secrets); otherwise
401 JSON {"error": "unauthorized", "detail"} with WWW-Authenticate: Bearer, before the body is
read. of-watchdog answers its health checks (/_/health) itself. Without the secret the server
refuses to start.
"""

import json
import os
import sys

from flask import Flask, Response, request
from function import handler
from waitress import serve

from runtime.function_auth import (
    FunctionToken,
    NoToken,
    token_path,
    unauthorized_body,
    unavailable_body,
)

app = Flask(__name__)
token = FunctionToken(token_path())


class Event:
    def __init__(self):
        self.body = request.get_data()
        self.headers = request.headers
        self.method = request.method
        self.query = request.args
        self.path = request.path


class Context:
    def __init__(self):
        self.hostname = os.getenv("HOSTNAME", "localhost")


def _headers(raw):
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


def format_response(res):
    if res is None:
        return ("", 200)
    if not isinstance(res, dict):
        return res
    status = int(res.get("statusCode") or 200)
    headers = _headers(res.get("headers"))
    has_type = any(k.lower() == "content-type" for k, _ in headers)
    body = res.get("body")
    if body is None:
        return Response(b"", status=status, headers=headers)
    if isinstance(body, (dict, list)):
        data = json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n"
        return Response(data, status=status, headers=headers,
                        mimetype=None if has_type else "application/json")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return Response(bytes(body), status=status, headers=headers,
                        mimetype=None if has_type else "application/octet-stream")
    return Response(str(body), status=status, headers=headers,
                    mimetype=None if has_type else "text/html")


@app.before_request
def require_function_token():
    # headers only: the body is not read before the caller is known
    try:
        why = token.refusal(request.headers.get("Authorization", "").encode("latin-1") or None)
    except NoToken as exc:
        return Response(unavailable_body(str(exc)), status=503, mimetype="application/json")
    if why is not None:
        return Response(unauthorized_body(why), status=401, mimetype="application/json",
                        headers={"WWW-Authenticate": "Bearer"})
    return None


@app.before_request
def fix_transfer_encoding():
    # Chunked request bodies: let werkzeug read to the end (python-flask-template #5).
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        request.environ["wsgi.input_terminated"] = True


@app.route("/", defaults={"path": ""}, methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
@app.route("/<path:path>", methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
def call_handler(path):
    return format_response(handler.handle(Event(), Context()))


if __name__ == "__main__":
    try:
        token.load()
    except NoToken as exc:  # secure by default: no token, no function
        print(f"refusing to start: {exc}", file=sys.stderr)
        sys.exit(1)
    # Model updates are hundreds of MB: raise waitress's 1 GiB default body cap to 4 GiB.
    serve(app, host="0.0.0.0", port=5000, threads=int(os.getenv("WAITRESS_THREADS", "4")),
          max_request_body_size=4 * 1024**3, channel_timeout=int(os.getenv("CHANNEL_TIMEOUT", "600")))
