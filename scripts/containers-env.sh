# Source this (`. scripts/containers-env.sh`) before running podman, buildah or skopeo: it points
# them at configuration and storage of FedFaaS's own, under the cache, so that nothing is read
# from or written to the host's /etc/containers, /var/lib/containers or /run/containers.
#
#   $FEDFAAS_CONTAINERS/containers.conf   default_ulimits these machines need (root may not raise
#                                         nofile above 20000 nor nproc above pid_max 32768:
#                                         podman's defaults make runc fail with "error setting
#                                         rlimit type 7"), cgroupfs (no systemd), file events,
#                                         and the engine's tmp, volume and network folders here
#   $FEDFAAS_CONTAINERS/storage.conf      overlay storage: graphroot storage/, runroot run/
#   $FEDFAAS_CONTAINERS/registries.conf   short names (FROM debian:bookworm-slim) resolve to
#                                         docker.io, where the local stand-ins are tagged
#   $FEDFAAS_CONTAINERS/policy.json       the signature policy (accept anything, as Debian's)
#
# Exports CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF,
# FEDFAAS_CONTAINERS and FEDFAAS_SIGNATURE_POLICY (pass it as --signature-policy to pulls; no
# variable names it). Idempotent: a file is rewritten only when its content would change.
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas). tests/containers/conftest.py
# (container_env) gives tests the same environment by sourcing this file.

FEDFAAS_CONTAINERS=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}/containers

_fedfaas_write() {  # _fedfaas_write FILE: stdin into FILE unless FILE already holds it
    local content
    content=$(cat)
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$content" ]; then
        printf '%s\n' "$content" >"$1.tmp" && mv -f "$1.tmp" "$1"
    fi
}

mkdir -p "$FEDFAAS_CONTAINERS/storage" "$FEDFAAS_CONTAINERS/run" "$FEDFAAS_CONTAINERS/tmp" \
    "$FEDFAAS_CONTAINERS/volumes" "$FEDFAAS_CONTAINERS/net.d" "$FEDFAAS_CONTAINERS/networks"

_fedfaas_write "$FEDFAAS_CONTAINERS/containers.conf" <<EOF
# written by scripts/containers-env.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$FEDFAAS_CONTAINERS/tmp/events.log"
tmp_dir = "$FEDFAAS_CONTAINERS/tmp"
image_copy_tmp_dir = "$FEDFAAS_CONTAINERS/tmp"
volume_path = "$FEDFAAS_CONTAINERS/volumes"

[network]
network_config_dir = "$FEDFAAS_CONTAINERS/net.d"
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/storage.conf" <<EOF
# written by scripts/containers-env.sh
[storage]
driver = "overlay"
graphroot = "$FEDFAAS_CONTAINERS/storage"
runroot = "$FEDFAAS_CONTAINERS/run"
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/registries.conf" <<EOF
# written by scripts/containers-env.sh
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/policy.json" <<EOF
{"default": [{"type": "insecureAcceptAnything"}]}
EOF

unset -f _fedfaas_write
export FEDFAAS_CONTAINERS
export CONTAINERS_CONF=$FEDFAAS_CONTAINERS/containers.conf
export CONTAINERS_STORAGE_CONF=$FEDFAAS_CONTAINERS/storage.conf
export CONTAINERS_REGISTRIES_CONF=$FEDFAAS_CONTAINERS/registries.conf
export FEDFAAS_SIGNATURE_POLICY=$FEDFAAS_CONTAINERS/policy.json
