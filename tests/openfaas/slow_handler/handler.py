"""Test-only function: sleeps ``?seconds=N`` (default 5) before answering, to meet exec_timeout."""

import time


def handle(event, context):
    seconds = float(event.query.get("seconds", "5"))
    time.sleep(seconds)
    return {"statusCode": 200, "body": {"slept": seconds}}
