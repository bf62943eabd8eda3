# Stand-in for ghcr.io/openfaas/queue-worker:0.14.1 (faasd's docker-compose.yaml `queue-worker`:
# takes asynchronous invocations from NATS Streaming and calls the functions through the gateway):
# OpenFaaS's nats-queue-worker 0.14.1, built from its vendored sources, on the Debian base, run
# as an unprivileged user as upstream's distroless image does. Built by deploy/faasd/images.sh
# from a context holding only that binary, named queue-worker.
FROM docker.io/library/debian:bookworm-slim
RUN useradd --system --no-create-home --home-dir /nonexistent worker
COPY queue-worker /worker
USER worker
CMD ["/worker"]
