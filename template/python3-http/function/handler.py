def handle(event, context):
    """Echo the request body. ``event.body`` is bytes; a bytes body is returned intact."""
    return {"statusCode": 200, "body": event.body}
