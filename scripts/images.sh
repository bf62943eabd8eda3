#!/usr/bin/env bash
# `make images`: build every FedFaaS container image with docker, podman or buildah.
#
#   $REGISTRY/fedfaas:$TAG     the services image (docker/fedfaas.Dockerfile, context: the repo)
#   $REGISTRY/<fn>:$TAG        each function of stack.yml and stack.platform.yml: faas-cli
#                              shrink-wraps its build context into build/<fn> (the template's
#                              Dockerfile, the handler, the configuration.copy entries) and the
#                              engine builds that folder, tagged as faas-cli names the image
#
# ENGINE   docker, podman or buildah (default: the first of them on PATH)
# REGISTRY default ghcr.io/fedfaas (the chart's image repositories)
# TAG      default charts/fedfaas/Chart.yaml appVersion (the chart's default image tag)
# faas-cli $FEDFAAS_OPENFAAS_BIN/faas-cli, else on PATH, else ../shared/openfaas/bin/faas-cli
#
# REGISTRY and TAG reach the stack files as FEDFAAS_REGISTRY and FEDFAAS_TAG.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STACKS=(stack.yml stack.platform.yml)

fail() {
    echo "images: $*" >&2
    exit 1
}

app_version() {
    sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' \
        charts/fedfaas/Chart.yaml
}

REGISTRY=${REGISTRY:-ghcr.io/fedfaas}
TAG=${TAG:-$(app_version)}
[ -n "$TAG" ] || fail "no TAG given and no appVersion in charts/fedfaas/Chart.yaml"
export FEDFAAS_REGISTRY=$REGISTRY FEDFAAS_TAG=$TAG
SERVICES=$REGISTRY/fedfaas:$TAG

if [ -n "${ENGINE:-}" ]; then
    command -v "$ENGINE" >/dev/null || fail "ENGINE=$ENGINE is not on PATH"
else
    for candidate in docker podman buildah; do
        if command -v "$candidate" >/dev/null; then
            ENGINE=$candidate
            break
        fi
    done
    [ -n "${ENGINE:-}" ] || fail "none of docker, podman or buildah was found on PATH" \
        "(set ENGINE=...); it would build $SERVICES and $REGISTRY/<fn>:$TAG for each" \
        "function of ${STACKS[*]}"
fi

FAAS_CLI=
if [ -n "${FEDFAAS_OPENFAAS_BIN:-}" ]; then
    FAAS_CLI=$FEDFAAS_OPENFAAS_BIN/faas-cli
elif command -v faas-cli >/dev/null; then
    FAAS_CLI=$(command -v faas-cli)
else
    FAAS_CLI=$ROOT/../shared/openfaas/bin/faas-cli
fi
[ -x "$FAAS_CLI" ] || fail "faas-cli not found ($FAAS_CLI): put it on PATH or set" \
    "FEDFAAS_OPENFAAS_BIN to its folder"

# `buildah build` is named `bud` in older buildah; both take -t, -f and a context.
build=("$ENGINE" build)
[ "$(basename "$ENGINE")" = buildah ] && build=("$ENGINE" bud)

echo "== $SERVICES (docker/fedfaas.Dockerfile)"
"${build[@]}" -t "$SERVICES" -f docker/fedfaas.Dockerfile .

for stack in "${STACKS[@]}"; do
    "$FAAS_CLI" build --shrinkwrap -f "$stack"
    # name and image of each function, as faas-cli resolves them (FEDFAAS_* substituted)
    images=$("$FAAS_CLI" generate -f "$stack" |
        awk '/^  name: /{name=$2} /^  image: /{print name, $2}')
    [ -n "$images" ] || fail "faas-cli generate -f $stack named no image"
    while read -r fn image; do
        [ -f "build/$fn/Dockerfile" ] || fail "faas-cli left no build/$fn/Dockerfile"
        echo "== $image (build/$fn, $stack)"
        "${build[@]}" -t "$image" -f "build/$fn/Dockerfile" "build/$fn"
    done <<<"$images"
done
