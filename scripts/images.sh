#!/usr/bin/env bash
# `make images`: build every FedFaaS container image with docker, podman or buildah.
#
#   $REGISTRY/fedfaas:$TAG     the services image (docker/fedfaas.Dockerfile, context: the repo)
#   $REGISTRY/<fn>:$TAG        each function of stack.yml and stack.platform.yml: faas-cli
#                              shrink-wraps its build context into build/<fn> (the template's
#                              Dockerfile, the handler, the configuration.copy entries) and the
#                              engine builds that folder, tagged as faas-cli names the image
#
# At the end, a table of the images built and their sizes. A failed build stops the run with
# "images: <image>: failed at step N/M: <instruction>" (podman and buildah number the steps of
# each stage: "... at step N/M of stage S/T: ..."), after the engine's own output.
#
# `scripts/images.sh check [STACK...]`: build nothing; exit 1 naming each function of the stack
# files (default: stack.yml stack.platform.yml, and then the services image too) whose image
# the engine does not have.
#
# ENGINE    docker, podman or buildah (default: the first of them on PATH that works: docker
#           only when `docker info` reaches a daemon). With podman or
#           buildah, scripts/containers-env.sh sets their configuration and storage (under
#           $FEDFAAS_CACHE, never the host's), and scripts/base-images.sh first pulls or makes
#           the base images the Dockerfiles name (no registry needed).
# REGISTRY  default ghcr.io/fedfaas (the chart's image repositories)
# TAG       default charts/fedfaas/Chart.yaml appVersion (the chart's default image tag)
# IMAGES    build only these (space-separated: `fedfaas` for the services image, function names)
# CA_BUNDLE the CA bundle pip trusts instead of its own (behind a TLS-intercepting proxy: the
#           system bundle, which holds the proxy's CA), given to the builds as the secret `ca`
#           (never in a layer); default /etc/ssl/certs/ca-certificates.crt when it exists;
#           empty: none
# NO_CACHE  1: build every step again (--no-cache), none from the engine's layer cache
# PYTHON_VERSION  the functions' Python (default 3.11, Debian bookworm's)
# faas-cli  $FEDFAAS_OPENFAAS_BIN/faas-cli, else on PATH, else ../shared/openfaas/bin/faas-cli
#
# REGISTRY and TAG reach the stack files as FEDFAAS_REGISTRY and FEDFAAS_TAG. Builds download
# (apt, pip) with --network host; podman's default bridge network is never used.
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

MODE=build
CHECK_SERVICES=1
if [ "${1:-}" = check ]; then
    MODE=check
    shift
    if [ $# -gt 0 ]; then
        STACKS=("$@")
        CHECK_SERVICES=
    fi
fi

REGISTRY=${REGISTRY:-ghcr.io/fedfaas}
TAG=${TAG:-$(app_version)}
[ -n "$TAG" ] || fail "no TAG given and no appVersion in charts/fedfaas/Chart.yaml"
export FEDFAAS_REGISTRY=$REGISTRY FEDFAAS_TAG=$TAG
SERVICES=$REGISTRY/fedfaas:$TAG
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
if [ -z "${CA_BUNDLE+set}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
fi
CA_BUNDLE=${CA_BUNDLE:-}
[ -z "$CA_BUNDLE" ] || [ -f "$CA_BUNDLE" ] || fail "CA_BUNDLE=$CA_BUNDLE is not a file"

if [ -n "${ENGINE:-}" ]; then
    command -v "$ENGINE" >/dev/null || fail "ENGINE=$ENGINE is not on PATH"
else
    for candidate in docker podman buildah; do
        command -v "$candidate" >/dev/null || continue
        # a docker client without a daemon it can reach (a machine image may ship the client
        # alone) cannot build: the next engine is taken
        if [ "$candidate" = docker ] && ! docker info >/dev/null 2>&1; then
            echo "images: docker is on PATH but reaches no Docker daemon; trying podman, buildah" >&2
            continue
        fi
        ENGINE=$candidate
        break
    done
    [ -n "${ENGINE:-}" ] || fail "none of docker, podman or buildah was found on PATH" \
        "(set ENGINE=...); it would build $SERVICES and $REGISTRY/<fn>:$TAG for each" \
        "function of ${STACKS[*]}"
fi
KIND=$(basename "$ENGINE")
if [ "$KIND" = podman ] || [ "$KIND" = buildah ]; then
    # shellcheck source=scripts/containers-env.sh
    . scripts/containers-env.sh
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

stack_images() {  # stack_images STACK: "name image" per function, as faas-cli resolves them
    local images
    images=$("$FAAS_CLI" generate -f "$1" | awk '/^  name: /{name=$2} /^  image: /{print name, $2}')
    [ -n "$images" ] || fail "faas-cli generate -f $1 named no image"
    printf '%s\n' "$images"
}

image_exists() {
    case $KIND in
    buildah) "$ENGINE" inspect --type image "$1" >/dev/null 2>&1 ;;
    *) "$ENGINE" image inspect "$1" >/dev/null 2>&1 ;;
    esac
}

if [ "$MODE" = check ]; then
    missing=0
    for stack in "${STACKS[@]}"; do
        [ -f "$stack" ] || fail "check: no stack file $stack"
        while read -r fn image; do
            if ! image_exists "$image"; then
                echo "images: $stack: function $fn: image $image was not built ($KIND has no" \
                    "such image; \`make images\` builds it)" >&2
                missing=1
            fi
        done < <(stack_images "$stack")
    done
    if [ -n "$CHECK_SERVICES" ] && ! image_exists "$SERVICES"; then
        echo "images: the services image $SERVICES was not built (\`make images\` builds it)" >&2
        missing=1
    fi
    exit "$missing"
fi

wanted() {  # wanted NAME: whether IMAGES (empty: all) names it
    [ -z "${IMAGES:-}" ] || [[ " $IMAGES " == *" $1 "* ]]
}

if [ "$KIND" = podman ] || [ "$KIND" = buildah ]; then
    bash scripts/base-images.sh
fi

LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
BUILT=()

# failed_step LOG: "N/M: INSTRUCTION" (or "N/M of stage S/T: ...") of the step the engine was
# at when the build failed, from its output
failed_step() {
    awk '
        # podman, buildah: "[S/T] STEP N/M: INSTRUCTION" ("STEP N/M: ..." with one stage)
        /^(\[[0-9]+\/[0-9]+\] )?STEP [0-9]+\/[0-9]+: / {
            stage = ""
            if ($1 ~ /^\[/) { stage = substr($1, 2, length($1) - 2); $1 = "" }
            sub(/^ *STEP /, "")
            step = $0
            if (stage != "") sub(/: /, " of stage " stage ": ", step)
        }
        # docker (BuildKit): " > [STAGE N/M] INSTRUCTION:" in its error summary
        /^ > \[[^]]*[0-9]+\/[0-9]+\] / {
            s = $0
            sub(/^ > \[/, "", s)
            sub(/:$/, "", s)
            n = split(s, parts, "] ")
            split(parts[1], words, " ")
            step = words[length(words)] ": " substr(s, length(parts[1]) + 3)
        }
        END { if (step != "") print step; else print "?: (the engine named no step; its output above)" }
    ' "$1"
}

# build IMAGE DOCKERFILE CONTEXT [ENGINE ARGS...]: one build; its output is shown and kept
build() {
    local image=$1 dockerfile=$2 context=$3 log
    shift 3
    local args=(--network host -t "$image" -f "$dockerfile")
    # docker's image format: OCI's has no HEALTHCHECK (the template's)
    [ "$KIND" = docker ] || args+=(--format docker)
    [ -z "$CA_BUNDLE" ] || args+=(--secret "id=ca,src=$CA_BUNDLE")
    [ "${NO_CACHE:-}" != 1 ] || args+=(--no-cache)
    log=$LOGS/$(echo "$image" | tr -c 'A-Za-z0-9._-' _).log
    local cmd=("$ENGINE" build)
    [ "$KIND" = buildah ] && cmd=("$ENGINE" bud)
    echo "== $image ($dockerfile)"
    if ! "${cmd[@]}" "${args[@]}" "$@" "$context" 2>&1 | tee "$log"; then
        fail "$image: failed at step $(failed_step "$log")"
    fi
    BUILT+=("$image")
}

size_of() {  # size_of IMAGE: its size in bytes, as the engine counts it
    case $KIND in
    buildah) "$ENGINE" images --json "$1" | sed -n 's/^ *"size": *\([0-9]*\).*/\1/p' | head -n 1 ;;
    *) "$ENGINE" image inspect --format '{{.Size}}' "$1" ;;
    esac
}

if wanted fedfaas; then
    build "$SERVICES" docker/fedfaas.Dockerfile .
fi

for stack in "${STACKS[@]}"; do
    images=$(stack_images "$stack")
    selected=$(while read -r fn image; do
        if wanted "$fn"; then echo "$fn $image"; fi
    done <<<"$images")
    [ -n "$selected" ] || continue
    if [ -z "${IMAGES:-}" ]; then
        "$FAAS_CLI" build --shrinkwrap -f "$stack"
    else  # --filter takes one name
        while read -r fn _; do
            "$FAAS_CLI" build --shrinkwrap -f "$stack" --filter "$fn"
        done <<<"$selected"
    fi
    while read -r fn image; do
        [ -f "build/$fn/Dockerfile" ] || fail "faas-cli left no build/$fn/Dockerfile"
        build "$image" "build/$fn/Dockerfile" "build/$fn" --build-arg "PYTHON_VERSION=$PYTHON_VERSION"
    done <<<"$selected"
done

echo
printf '%-48s %10s\n' IMAGE SIZE
for image in "${BUILT[@]}"; do
    bytes=$(size_of "$image" || true)
    if [ -n "$bytes" ]; then
        printf '%-48s %7d MB\n' "$image" $((bytes / 1000000))
    else
        printf '%-48s %10s\n' "$image" "?"
    fi
done
