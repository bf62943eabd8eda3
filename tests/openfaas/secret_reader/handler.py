"""Test-only function: answers the value of the secret named by the request body, read from the
secrets folder (FEDFAAS_SECRETS_DIR), and prints a line that `faas-cli logs` shows."""

import os


def handle(event, context):
    name = event.body.decode()
    print(f"secret-reader: reading {name}", flush=True)
    path = os.path.join(os.environ["FEDFAAS_SECRETS_DIR"], name)
    try:
        with open(path, "rb") as f:
            return {"statusCode": 200, "body": f.read()}
    except FileNotFoundError:
        return {"statusCode": 404, "body": {"error": "not_found", "detail": f"no secret {name}"}}
