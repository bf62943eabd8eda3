# Stand-in for docker.io/prom/prometheus:<version> (faasd's docker-compose.yaml runs it, as
# user 65534 with /etc/prometheus/prometheus.yml and /prometheus bind-mounted), made by
# scripts/base-images.sh when no registry serves it: Debian's prometheus package on the Debian
# base, with upstream's entry point, arguments, user and folders.
FROM docker.io/library/debian:bookworm-slim
# policy-rc.d: the package's postinst would start its init script inside the build.
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update -qy \
    && apt-get install -qy --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && mkdir -p /prometheus && chown 65534:65534 /prometheus
USER 65534
WORKDIR /prometheus
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.console.libraries=/etc/prometheus/console_libraries", \
     "--web.console.templates=/etc/prometheus/consoles"]
