# Stand-in for docker.io/library/nats-streaming:0.25.6 (faasd's docker-compose.yaml `nats`, which
# carries asynchronous invocations to the queue worker): nats-streaming-server v0.25.6 built from
# the Go module proxy, on the Debian base, at upstream's path. Built by deploy/faasd/images.sh
# from a context holding only that binary, named nats-streaming-server.
FROM docker.io/library/debian:bookworm-slim
COPY nats-streaming-server /nats-streaming-server
EXPOSE 4222 8222
CMD ["/nats-streaming-server", "-m", "8222"]
