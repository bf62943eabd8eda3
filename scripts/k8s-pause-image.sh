#!/usr/bin/env bash
# The pod sandbox ("pause") image a kubelet's containerd starts first in every pod, built here
# from Kubernetes' own source, with no registry: kubernetes' build/pause/linux/pause.c (in the
# Go module k8s.io/kubernetes, which scripts/k8s-binaries.sh downloads anyway) compiled
# statically with gcc as upstream's build/pause/Makefile does, in a `FROM scratch` image run as
# 65535:65535, into podman's store (scripts/containers-env.sh). Kept when the store has it.
#
#   scripts/k8s-pause-image.sh          prints the image's name (localhost/fedfaas/pause:3.10.1)
#
# Environment: FEDFAAS_CACHE, FEDFAAS_K8S_VERSION (as scripts/k8s-binaries.sh).
# Needs root (podman's store), podman, Go; installs Debian's gcc and libc6-dev (static libc)
# where they are missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${FEDFAAS_K8S_VERSION:-v1.34.12}
TAG=3.10.1  # upstream's build/pause/Makefile TAG in 1.34
IMAGE=localhost/fedfaas/pause:$TAG
log() { printf '[k8s-pause-image] %s\n' "$*" >&2; }
die() { printf '[k8s-pause-image] error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/containers-env.sh
. "$ROOT/scripts/containers-env.sh"
command -v podman >/dev/null || die "podman is not installed (scripts/setup.sh installs it)"
if podman image exists "$IMAGE"; then
    echo "$IMAGE"
    exit 0
fi
if ! command -v gcc >/dev/null || [ ! -f "/usr/lib/$(uname -m)-linux-gnu/libc.a" ]; then
    log "apt-get install gcc libc6-dev (a static pause binary)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null ||
        die "apt-get install gcc libc6-dev failed"
fi
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || die "Go is needed to fetch k8s.io/kubernetes $VERSION's source"

src=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$VERSION" \
    | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -f "$src/build/pause/linux/pause.c" ] ||
    die "no build/pause/linux/pause.c in k8s.io/kubernetes@$VERSION ($src)"

WORK=$(mktemp -d "$FEDFAAS_CONTAINERS/tmp/pause.XXXXXX")
trap 'rm -rf --one-file-system "$WORK"' EXIT
log "compiling pause.c of k8s.io/kubernetes@$VERSION"
gcc -Os -Wall -Werror -static "-DVERSION=v$TAG-fedfaas" -o "$WORK/pause" \
    "$src/build/pause/linux/pause.c" || die "gcc failed (static libc: apt-get install libc6-dev)"
strip "$WORK/pause"
cat >"$WORK/Containerfile" <<'EOF'
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
EOF
podman build --network none -q -t "$IMAGE" "$WORK" >/dev/null || die "podman build failed"
log "built $IMAGE"
echo "$IMAGE"
