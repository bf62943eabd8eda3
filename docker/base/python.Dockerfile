# Stand-in for docker.io/library/python:3.11-slim-bookworm (the python3-http template's base),
# made by scripts/base-images.sh when no registry serves the upstream image: Debian's Python
# 3.11 on the debootstrapped Debian base, with `python` and `pip` where the upstream image has
# them (/usr/local/bin) and pip allowed to install outside a venv (EXTERNALLY-MANAGED removed,
# as in the upstream image, whose Python is not Debian's).
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update -qy \
    && apt-get install -qy --no-install-recommends python3 python3-pip python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/python3 /usr/local/bin/python \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip
ENV LANG=C.UTF-8
CMD ["python3"]
