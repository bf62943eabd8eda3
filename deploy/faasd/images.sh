#!/usr/bin/env bash
# The images of FedFaaS's faasd deployment that `make images` does not build (podman, in
# scripts/containers-env.sh's store), each on the Debian base (scripts/base-images.sh makes it
# where no registry serves it):
#
#   localhost/fedfaas/minio:$TAG            images/minio.Dockerfile: the MinIO `make setup` built
#   localhost/fedfaas/redis:$TAG            images/redis.Dockerfile: Debian's redis-server
#   docker.io/library/nats-streaming:0.25.6 images/nats-streaming.Dockerfile: stand-in, built
#                                           from the Go module proxy (go install, cached)
#   ghcr.io/openfaas/queue-worker:0.14.1    images/queue-worker.Dockerfile: stand-in, from a
#                                           queue-worker binary if one is found (see below)
#
# The queue worker (github.com/openfaas/nats-queue-worker) cannot come from the Go module proxy:
# it answers 403 for OpenFaaS's modules. Put a binary built from its sources at tag 0.14.1
# (`CGO_ENABLED=0 go build -mod=vendor`) at $FEDFAAS_OPENFAAS_BIN/queue-worker or
# ~/.cache/fedfaas/bin/queue-worker; without one, NATS Streaming and the queue worker are left
# out and faasd runs without asynchronous invocations (deploy/faasd/prepare.py --no-async).
#
# TAG: default charts/fedfaas/Chart.yaml appVersion (docker-compose.yaml names that tag).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/containers-env.sh
. scripts/containers-env.sh
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
HERE=deploy/faasd/images
TAG=${TAG:-$(sed -n \
    's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' \
    charts/fedfaas/Chart.yaml)}
NATS_VERSION=v0.25.6

log() { printf 'faasd-images: %s\n' "$*"; }
fail() {
    printf 'faasd-images: %s\n' "$*" >&2
    exit 1
}

command -v podman >/dev/null || fail "podman is not installed (scripts/setup.sh installs it)"
podman image exists docker.io/library/debian:bookworm-slim || bash scripts/base-images.sh

WORK=$(mktemp -d "$FEDFAAS_CONTAINERS/tmp/faasd-images.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

build() {  # build IMAGE DOCKERFILE NETWORK [BINARY]: the context holds BINARY only
    local image=$1 dockerfile=$2 network=$3 binary=${4:-} ctx=$WORK/${1//[\/:]/_}
    mkdir -p "$ctx"
    [ -z "$binary" ] || cp "$binary" "$ctx/"
    log "$image ($dockerfile)"
    if ! podman build --network "$network" -t "$image" -f "$dockerfile" "$ctx" \
        >"$WORK/build.log" 2>&1; then
        step=$(grep -o 'STEP [0-9]*/[0-9]*: .*' "$WORK/build.log" | tail -n 1)
        tail -n 20 "$WORK/build.log" >&2
        fail "$image: failed at ${step:-its first step}"
    fi
}

found() {  # found NAME: the first executable NAME in the OpenFaaS folder or the cache
    local dir
    for dir in "${FEDFAAS_OPENFAAS_BIN:-}" "$CACHE/bin"; do
        if [ -n "$dir" ] && [ -x "$dir/$1" ]; then
            echo "$dir/$1"
            return 0
        fi
    done
    return 1
}

minio=$(command -v minio || true)
[ -n "$minio" ] || minio=$(found minio) || fail "no minio binary: run \`make setup\` first"
build "localhost/fedfaas/minio:$TAG" "$HERE/minio.Dockerfile" none "$minio"
build "localhost/fedfaas/redis:$TAG" "$HERE/redis.Dockerfile" host

nats=$(found nats-streaming-server) || {
    log "building nats-streaming-server $NATS_VERSION from the Go module proxy (about a minute)"
    GOBIN="$CACHE/bin" CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
        go install "github.com/nats-io/nats-streaming-server@$NATS_VERSION" ||
        fail "go install github.com/nats-io/nats-streaming-server@$NATS_VERSION failed"
    nats=$CACHE/bin/nats-streaming-server
}
build docker.io/library/nats-streaming:0.25.6 "$HERE/nats-streaming.Dockerfile" none "$nats"

if worker=$(found queue-worker); then
    build ghcr.io/openfaas/queue-worker:0.14.1 "$HERE/queue-worker.Dockerfile" none "$worker"
else
    why=$(GOFLAGS=-mod=mod go list -m -versions github.com/openfaas/nats-queue-worker 2>&1 |
        head -n 1 || true)
    log "ghcr.io/openfaas/queue-worker:0.14.1 not built: no queue-worker binary, and the Go" \
        "module proxy does not serve it (${why:-no answer}); faasd runs without asynchronous" \
        "invocations"
fi

BUILT='^(localhost/fedfaas/(minio|redis)|docker.io/library/nats-streaming'
BUILT+='|ghcr.io/openfaas/queue-worker):'
podman images --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E "$BUILT" | sort |
    sed 's/^/faasd-images:   /'
