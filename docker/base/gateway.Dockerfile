# Stand-in for ghcr.io/openfaas/gateway:<version> (faasd's docker-compose.yaml runs it), made
# by scripts/base-images.sh when no registry serves it: the gateway binary built from upstream
# (FEDFAAS_OPENFAAS_BIN) on the Debian base, run as the unprivileged user `app` from
# /home/app, as upstream's image does. Context: a folder holding only that binary, named gateway.
FROM docker.io/library/debian:bookworm-slim
RUN groupadd --system app && useradd --system --gid app --create-home --home-dir /home/app app
COPY gateway /home/app/gateway
WORKDIR /home/app
EXPOSE 8080
USER app
CMD ["./gateway"]
