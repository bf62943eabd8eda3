"""echo: send the request body back byte for byte; a GET without a body says which replica answered.

A tiny real function for demos and tests (python3-http contract).
"""

import os


def handle(event, context):
    if event.method in ("GET", "HEAD") and not event.body:
        return {
            "statusCode": 200,
            "body": {
                "function": os.environ.get("FEDFAAS_FUNCTION_NAME", "echo"),
                "hostname": context.hostname,
                "replica": os.environ.get("FEDFAAS_REPLICA", ""),
                "pid": os.getpid(),
                "path": event.path,
                "query": event.query.to_dict(),
            },
        }
    content_type = event.headers.get("Content-Type") or "application/octet-stream"
    return {"statusCode": 200, "body": event.body, "headers": {"Content-Type": content_type}}
