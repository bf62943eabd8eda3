# Redis for FedFaaS under faasd (deploy/faasd/docker-compose.yaml `redis`): Debian's redis-server on
# the Debian base, run as uid 12000 with the configuration deploy/faasd/prepare.py writes (default
# user off, one ACL user per component). Built by deploy/faasd/images.sh (empty context).
FROM docker.io/library/debian:bookworm-slim
# policy-rc.d: the package's postinst would start its init script inside the build
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update -qy \
    && apt-get install -qy --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && groupadd --gid 12000 fedfaas \
    && useradd --uid 12000 --gid 12000 --no-create-home --home-dir /data fedfaas
USER 12000:12000
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "yes"]
