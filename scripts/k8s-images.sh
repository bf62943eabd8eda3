#!/usr/bin/env bash
# The images a test node runs besides FedFaaS's, built here with no registry into podman's store
# (scripts/containers-env.sh), both `FROM scratch` with one binary; each kept when the store has
# it:
#
#   localhost/fedfaas/pause:3.10.1     the pod sandbox ("pause") image a kubelet's containerd
#                                      starts first in every pod: kubernetes'
#                                      build/pause/linux/pause.c (in the Go module
#                                      k8s.io/kubernetes) compiled statically with gcc as
#                                      upstream's build/pause/Makefile does, run as 65535:65535
#   localhost/fedfaas/coredns:v1.12.1  CoreDNS as scripts/k8s-binaries.sh built it (run
#                                      `scripts/k8s-binaries.sh coredns` first)
#   localhost/fedfaas/minio-server:TAG deploy/faasd's MinIO image (deploy/faasd/images.sh
#                                      builds localhost/fedfaas/minio:TAG) with the entrypoint
#                                      of upstream's quay.io/minio/minio, `minio`, so that the
#                                      chart's arguments (`server /data ...`) run as upstream's
#                                      image runs them (TAG: the chart's appVersion)
#
#   scripts/k8s-images.sh          prints the images' names
#
# Environment: FEDFAAS_CACHE, FEDFAAS_K8S_VERSION, FEDFAAS_COREDNS_VERSION (as
# scripts/k8s-binaries.sh), TAG. Needs root (podman's store), podman, Go; installs Debian's gcc and
# libc6-dev (static libc) where they are missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${FEDFAAS_K8S_VERSION:-v1.34.12}
COREDNS_VERSION=${FEDFAAS_COREDNS_VERSION:-v1.12.1}
BINARIES=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}/k8s/$VERSION
PAUSE_TAG=3.10.1  # upstream's build/pause/Makefile TAG in 1.34
PAUSE_IMAGE=localhost/fedfaas/pause:$PAUSE_TAG
COREDNS_IMAGE=localhost/fedfaas/coredns:$COREDNS_VERSION
TAG=${TAG:-$(sed -n \
    's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' \
    "$ROOT/charts/fedfaas/Chart.yaml")}
MINIO_IMAGE=localhost/fedfaas/minio-server:$TAG
log() { printf '[k8s-images] %s\n' "$*" >&2; }
die() { printf '[k8s-images] error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/containers-env.sh
. "$ROOT/scripts/containers-env.sh"
command -v podman >/dev/null || die "podman is not installed (scripts/setup.sh installs it)"

build_pause() {  # pause.c of k8s.io/kubernetes@$VERSION, static, in $WORK/pause
    local src
    if ! command -v gcc >/dev/null || [ ! -f "/usr/lib/$(uname -m)-linux-gnu/libc.a" ]; then
        log "apt-get install gcc libc6-dev (a static pause binary)"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        export DEBIAN_FRONTEND=noninteractive
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null ||
            die "apt-get install gcc libc6-dev failed"
    fi
    command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || export PATH=$PATH:/usr/local/go/bin
    command -v go >/dev/null || die "Go is needed to fetch k8s.io/kubernetes $VERSION's source"
    src=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$VERSION" |
        sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -f "$src/build/pause/linux/pause.c" ] ||
        die "no build/pause/linux/pause.c in k8s.io/kubernetes@$VERSION ($src)"
    log "compiling pause.c of k8s.io/kubernetes@$VERSION"
    gcc -Os -Wall -Werror -static "-DVERSION=v$PAUSE_TAG-fedfaas" -o "$WORK/pause/pause" \
        "$src/build/pause/linux/pause.c" || die "gcc failed"
    strip "$WORK/pause/pause"
    cat >"$WORK/pause/Containerfile" <<'EOF'
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
EOF
    podman build --network none -q -t "$PAUSE_IMAGE" "$WORK/pause" >/dev/null ||
        die "podman build of $PAUSE_IMAGE failed"
    log "built $PAUSE_IMAGE"
}

build_coredns() {  # the cached CoreDNS binary in $WORK/coredns
    [ -x "$BINARIES/coredns" ] ||
        die "no $BINARIES/coredns: run scripts/k8s-binaries.sh coredns (make k8s-binaries)"
    cp "$BINARIES/coredns" "$WORK/coredns/coredns"
    cat >"$WORK/coredns/Containerfile" <<'EOF'
FROM scratch
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]
EOF
    podman build --network none -q -t "$COREDNS_IMAGE" "$WORK/coredns" >/dev/null ||
        die "podman build of $COREDNS_IMAGE failed"
    log "built $COREDNS_IMAGE"
}

build_minio() {  # deploy/faasd's MinIO image with upstream's entrypoint
    podman image exists "localhost/fedfaas/minio:$TAG" ||
        die "no localhost/fedfaas/minio:$TAG: run deploy/faasd/images.sh first"
    printf 'FROM localhost/fedfaas/minio:%s\nENTRYPOINT ["minio"]\nCMD ["server", "/data"]\n' \
        "$TAG" >"$WORK/minio/Containerfile"
    podman build --network none -q -t "$MINIO_IMAGE" "$WORK/minio" >/dev/null ||
        die "podman build of $MINIO_IMAGE failed"
    log "built $MINIO_IMAGE"
}

WORK=$(mktemp -d "$FEDFAAS_CONTAINERS/tmp/k8s-images.XXXXXX")
trap 'rm -rf --one-file-system "$WORK"' EXIT
mkdir -p "$WORK/pause" "$WORK/coredns" "$WORK/minio"
podman image exists "$PAUSE_IMAGE" || build_pause
podman image exists "$COREDNS_IMAGE" || build_coredns
podman image exists "$MINIO_IMAGE" || build_minio
echo "$PAUSE_IMAGE"
echo "$COREDNS_IMAGE"
echo "$MINIO_IMAGE"
