# MinIO for FedFaaS under faasd (deploy/faasd/docker-compose.yaml `minio`): the server `make setup`
# builds from the Go module proxy (~/.cache/fedfaas/bin/minio) on the Debian base, run as uid
# 12000 (its data folder is a bind mount faasd hands to that uid). Built by deploy/faasd/images.sh
# from a context holding only that binary, named minio.
FROM docker.io/library/debian:bookworm-slim
RUN groupadd --gid 12000 fedfaas \
    && useradd --uid 12000 --gid 12000 --no-create-home --home-dir /data fedfaas
COPY minio /usr/bin/minio
USER 12000:12000
EXPOSE 9000 9001
CMD ["minio", "server", "/data", "--address", ":9000", "--console-address", ":9001"]
