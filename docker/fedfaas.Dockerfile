# The FedFaaS services image (ghcr.io/fedfaas/fedfaas:<appVersion>, charts/fedfaas `image`): one
# image holds the core library; each chart component runs its own module
# (`python -m gateway|control_plane|cache_engine|request_tracker|fedfaas.provision_minio`; the
# operations console, `python -m console`, is in it too).
# Built from the repository root: `make images`, or
#   podman build --network host --secret id=ca,src=<CA bundle> \
#       -f docker/fedfaas.Dockerfile -t ghcr.io/fedfaas/fedfaas:0.1.0 .
# (the function images come from template/python3-http through faas-cli; scripts/images.sh).
# The secret `ca` (optional) is the CA bundle pip trusts instead of its own, for a
# TLS-intercepting proxy: mounted for the pip steps only, it is in no layer.
# Here, not at the root, so that the root holds no Dockerfile a reader could take for a
# function's; the context is still the root, and /.dockerignore keeps .git, .venv, .state,
# bench/results and build/ out of it.
#
# Debian bookworm: the node gateway's eBPF router uses bcc, whose Python bindings are Debian's
# python3-bpfcc, built for Debian's python3 (3.11, which pyproject.toml's requires-python
# admits). The venv sees them through --system-site-packages.
#
# No torch: no service imports it (tests/test_images.py checks that the services start without
# it); pyproject.toml's `torch` extra, which this image leaves out, has it for the code paths
# that need it (torch-format objects in core.objstore, the torch FedAvg kernel,
# cache_engine's in-process evaluators).
FROM debian:bookworm-slim AS base
RUN apt-get update -qy \
    && apt-get install -qy --no-install-recommends python3 python3-bpfcc ca-certificates \
    && rm -rf /var/lib/apt/lists/*

FROM base AS build
RUN apt-get update -qy \
    && apt-get install -qy --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The dependencies first, read from pyproject.toml: a change to the sources does not download
# them again.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca,mode=0444 \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv --system-site-packages /opt/fedfaas \
    && python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
       >/tmp/requirements.txt \
    && /opt/fedfaas/bin/pip install --no-cache-dir -r /tmp/requirements.txt
# What `pip install .` needs: pyproject.toml and the packages it lists
# ([tool.setuptools.packages.find] include; tests/test_images.py holds the two together).
COPY core ./core
COPY flstore_workloads ./flstore_workloads
COPY runtime ./runtime
COPY fedfaas ./fedfaas
COPY gateway ./gateway
COPY bpf ./bpf
COPY cache_engine ./cache_engine
COPY request_tracker ./request_tracker
COPY control_plane ./control_plane
COPY client ./client
COPY console ./console
# pip, setuptools and wheel leave with the build: the services never install anything.
RUN --mount=type=secret,id=ca,mode=0444 \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/fedfaas/bin/pip install --no-cache-dir --no-deps . \
    && /opt/fedfaas/bin/pip uninstall -qy pip setuptools wheel

FROM base
COPY --from=build /opt/fedfaas /opt/fedfaas
# uid and gid 12000: the chart runs these pods as runAsUser 12000 with fsGroup 12000
# (charts/fedfaas/templates/_helpers.tpl), and the secret files it mounts are group-readable
# by that group only; a passwd entry gives the uid a name and a HOME.
RUN groupadd --gid 12000 fedfaas \
    && useradd --uid 12000 --gid 12000 --create-home --home-dir /home/fedfaas fedfaas
# `python` is the venv's (the chart's commands say `python -m ...`; Debian has only python3).
# No .pyc writes: the chart's containers have a read-only root filesystem.
ENV PATH=/opt/fedfaas/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/fedfaas
USER 12000:12000
CMD ["fedfaas", "--help"]
