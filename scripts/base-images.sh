#!/usr/bin/env bash
# `make base-images` (and `make images`, through scripts/images.sh, when one is missing): the
# upstream base images FedFaaS's Dockerfiles and faasd's docker-compose.yaml name, in podman's
# store (scripts/containers-env.sh). Each is kept when the store has it, else pulled, else (no
# registry answers) made here from Debian packages and OpenFaaS's own binaries:
#
#   docker.io/library/debian:bookworm-slim   debootstrap --variant=minbase from the host's
#                                            Debian mirror, slimmed as upstream's (no docs,
#                                            man pages, locales, apt caches); also tagged
#                                            localhost/debian:bookworm-slim
#   docker.io/library/python:3.11-slim-...   docker/base/python.Dockerfile (Debian's Python 3.11)
#   ghcr.io/openfaas/of-watchdog:<v>         docker/base/of-watchdog.Dockerfile (<v>: the
#                                            template's FROM line)
#   ghcr.io/openfaas/gateway:0.27.5          docker/base/gateway.Dockerfile   } the versions
#   docker.io/prom/prometheus:v2.49.1        docker/base/prometheus.Dockerfile} faasd 0.19.0's
#                                                                              compose file names
#
# Environment: FEDFAAS_CACHE (podman's store is under it), FEDFAAS_OPENFAAS_BIN (of-watchdog and
# gateway; default ../shared/openfaas/bin beside the repo), FEDFAAS_PULL_TIMEOUT (seconds a pull
# may take, default 30), DEBIAN_MIRROR (default: the host's first bookworm URI in
# /etc/apt/sources.list.d/debian.sources, else http://deb.debian.org/debian).
# Needs root (debootstrap, podman's store), podman and debootstrap (scripts/setup.sh installs them).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/containers-env.sh
. scripts/containers-env.sh

DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
WATCHDOG_IMAGE=$(sed -n 's/^FROM .*[[:space:]]\(ghcr\.io\/openfaas\/of-watchdog:[^[:space:]]*\)[[:space:]].*/\1/p' \
    template/python3-http/Dockerfile)
GATEWAY_IMAGE=ghcr.io/openfaas/gateway:0.27.5
PROMETHEUS_IMAGE=docker.io/prom/prometheus:v2.49.1
PULL_TIMEOUT=${FEDFAAS_PULL_TIMEOUT:-30}
OPENFAAS_BIN=${FEDFAAS_OPENFAAS_BIN:-$ROOT/../shared/openfaas/bin}
SOURCES=/etc/apt/sources.list.d/debian.sources

log() { printf 'base-images: %s\n' "$*"; }
fail() {
    printf 'base-images: %s\n' "$*" >&2
    exit 1
}

[ -n "$WATCHDOG_IMAGE" ] || fail "no ghcr.io/openfaas/of-watchdog FROM line in template/python3-http/Dockerfile"
command -v podman >/dev/null || fail "podman is not installed (scripts/setup.sh installs it)"

# one run at a time on a store: a second waits, then finds the images made
exec 9>"$FEDFAAS_CONTAINERS/base-images.lock"
flock 9

WORK=$(mktemp -d "$FEDFAAS_CONTAINERS/tmp/base-images.XXXXXX")
trap 'rm -rf --one-file-system "$WORK"' EXIT

pulled() {  # pulled IMAGE: whether a registry served it within PULL_TIMEOUT seconds
    timeout "$PULL_TIMEOUT" podman pull -q --signature-policy "$FEDFAAS_SIGNATURE_POLICY" "$1" \
        >/dev/null 2>"$WORK/pull.log"
}

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    # deb822: the URIs of the first stanza whose Suites name bookworm
    [ -f "$SOURCES" ] && awk '
        /^[[:space:]]*$/ { if (uri != "" && suite) { print uri; exit } uri = ""; suite = 0; next }
        /^URIs:/ { uri = $2 }
        /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
        END { if (uri != "" && suite) print uri }' "$SOURCES" | head -n 1 | grep . ||
        echo http://deb.debian.org/debian
}

make_debian() {
    local mirror rootfs=$WORK/rootfs
    command -v debootstrap >/dev/null || fail "debootstrap is not installed (scripts/setup.sh installs it)"
    mirror=$(debian_mirror)
    log "$DEBIAN_IMAGE: debootstrap --variant=minbase bookworm from $mirror"
    # in a mount namespace of its own: the proc and sys it mounts in its target go with it
    # (whatever happens), and mount(8)'s lock files land on a private /run
    unshare --mount --propagation private -- sh -c 'mount -n -t tmpfs tmpfs /run && exec "$@"' \
        debootstrap debootstrap --variant=minbase bookworm "$rootfs" "$mirror" \
        >"$WORK/debootstrap.log" 2>&1 || {
        tail -n 20 "$WORK/debootstrap.log" >&2
        fail "$DEBIAN_IMAGE: debootstrap failed (its log above)"
    }
    # slim as upstream's debian:bookworm-slim: later apt installs leave out docs and locales,
    # apt keeps no package cache, and the image holds no host file (resolv.conf, hostname)
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
        "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/tmp/* "$rootfs"/dev/* \
        "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname "$rootfs"/etc/apt/sources.list
    if [ -f "$SOURCES" ] && [ -z "${DEBIAN_MIRROR:-}" ]; then
        cp "$SOURCES" "$rootfs/etc/apt/sources.list.d/debian.sources"
    else
        printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$mirror" >"$rootfs/etc/apt/sources.list.d/debian.sources"
    fi
    tar --numeric-owner --xattrs -C "$rootfs" -c . |
        podman import --quiet --change 'CMD ["bash"]' - localhost/debian:bookworm-slim >/dev/null
    podman tag localhost/debian:bookworm-slim "$DEBIAN_IMAGE"
}

make_from() {  # make_from IMAGE DOCKERFILE NETWORK [BINARY]: a stand-in built from docker/base
    local image=$1 dockerfile=$2 network=$3 binary=${4:-} context=$WORK/context
    rm -rf "$context" && mkdir -p "$context"
    if [ -n "$binary" ]; then
        [ -x "$OPENFAAS_BIN/$binary" ] || fail "$image: no $OPENFAAS_BIN/$binary (set FEDFAAS_OPENFAAS_BIN to the folder of OpenFaaS's binaries)"
        cp "$OPENFAAS_BIN/$binary" "$context/$binary"
    fi
    log "$image: building the stand-in (docker/base/$dockerfile)"
    podman build -q --network "$network" -t "$image" -f "docker/base/$dockerfile" "$context" \
        >"$WORK/build.log" 2>&1 || {
        tail -n 20 "$WORK/build.log" >&2
        fail "$image: the build of docker/base/$dockerfile failed (its log above)"
    }
}

ensure() {  # ensure IMAGE MAKER...: kept, pulled, or made with MAKER...
    local image=$1
    shift
    if podman image exists "$image"; then
        log "$image: in the store"
    elif pulled "$image"; then
        log "$image: pulled"
    else
        log "$image: no registry served it ($(tail -n 1 "$WORK/pull.log" | cut -c1-160))"
        "$@"
    fi
}

ensure "$DEBIAN_IMAGE" make_debian
ensure "$PYTHON_IMAGE" make_from "$PYTHON_IMAGE" python.Dockerfile host
ensure "$WATCHDOG_IMAGE" make_from "$WATCHDOG_IMAGE" of-watchdog.Dockerfile none of-watchdog
ensure "$GATEWAY_IMAGE" make_from "$GATEWAY_IMAGE" gateway.Dockerfile none gateway
ensure "$PROMETHEUS_IMAGE" make_from "$PROMETHEUS_IMAGE" prometheus.Dockerfile host
