#!/usr/bin/env bash
# Installs everything FedFaaS needs on Debian 12 (root, package registries only).
# Idempotent: each step checks first, so a second run takes a few seconds.
#   apt:   redis-server, prometheus (its system service stopped and disabled), python3-venv,
#          python3-bpfcc + kernel headers (+ the link bcc looks for)
#   apt:   chromium + chromium-driver with FEDFAAS_BROWSER=1 (the console's browser tests)
#   apt:   the container tools (podman buildah skopeo debootstrap containerd runc CNI plugins
#          fuse-overlayfs slirp4netns uidmap xz-utils): `make images`, tests/containers
#   .venv: the Python dependencies (with the `torch` extra: torch and torchvision from PyPI), the
#          project in editable mode, installed with uv (pinned, from PyPI; cache in $CACHE/uv)
#   MinIO: built with `go install github.com/minio/minio@latest` into a cache folder, unless on PATH
#   helm:  built the same way (about 3 minutes on 2 cores; FEDFAAS_SKIP_HELM=1 skips it; only the
#          chart's lint/template tests need it)
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas), FEDFAAS_VENV (default ./.venv),
#              FEDFAAS_PYTHON (interpreter for the venv), FEDFAAS_SKIP_HELM=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VENV=${FEDFAAS_VENV:-$ROOT/.venv}
log() { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] warning: %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "not root and no sudo: run as root, or install sudo"
  SUDO="sudo"
fi
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)

# --- 1. Debian packages ------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
APT_UPDATED=""
apt_install() {  # apt_install PKG... ; installs the missing ones, returns apt's status
  local missing=""
  for p in "$@"; do installed "$p" || missing="$missing $p"; done
  [ -n "$missing" ] || return 0
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$APT_UPDATED" ]; then
    log "apt-get update"
    $SUDO apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install$missing"
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
}
command -v dpkg-query >/dev/null || die "this script expects Debian 12 (dpkg/apt not found)"
apt_install redis-server python3 python3-venv python3-pip ca-certificates curl iproute2 procps \
  || die "apt-get install failed (see above)"
# Prometheus: the real OpenFaaS gateway needs one (tests/openfaas). FedFaaS starts its own on a
# free loopback port (core.services.PrometheusServer); Debian enables and starts a system
# service on :9090, which nothing here uses: stop and disable it so that no port stays taken.
if ! installed prometheus; then
  apt_install prometheus || die "apt-get install prometheus failed (see above)"
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  else
    $SUDO service prometheus stop >/dev/null 2>&1 || true
    $SUDO update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi
# Containers (`make images`, tests/containers): Debian's engines and runtimes, used through
# scripts/containers-env.sh (configuration and storage of FedFaaS's own). containerd and runc
# are left alone where a binary is already there: Docker's containerd.io package provides both
# and conflicts with Debian's.
containers="podman buildah skopeo debootstrap containernetworking-plugins fuse-overlayfs"
containers="$containers slirp4netns uidmap xz-utils"
for p in containerd runc; do
  command -v "$p" >/dev/null && ! installed "$p" || containers="$containers $p"
done
# shellcheck disable=SC2086
apt_install $containers \
  || warn "could not install the container tools; make images and tests/containers need them"
# The console's browser tests (tests/console, slow tier) drive Debian's Chromium through its
# chromedriver: installed only when asked (FEDFAAS_BROWSER=1, `make browser`, which the slow tier
# and `make docs-console` run), so that `make test` does not download a browser it never starts.
if [ "${FEDFAAS_BROWSER:-0}" = 1 ]; then
  apt_install chromium chromium-driver \
    || warn "could not install chromium; tests/console's browser tests need it"
fi
# eBPF is optional: without bcc or headers the userspace router takes over.
apt_install python3-bpfcc bpfcc-tools "linux-headers-$ARCH" \
  || warn "could not install bcc or kernel headers; eBPF falls back to the userspace router"

# --- 2. Kernel headers where bcc looks for them --------------------------------------------
# bcc compiles against /lib/modules/$(uname -r)/build. A cloud kernel seldom ships its own
# headers; SK_MSG programs use only stable UAPI types, so Debian's installed headers serve.
KBUILD=/lib/modules/$(uname -r)/build
if [ ! -e "$KBUILD" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-"$ARCH" 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$hdr" ]; then
    log "linking $KBUILD -> $hdr"
    $SUDO mkdir -p "$(dirname "$KBUILD")"
    $SUDO ln -sfn "$hdr" "$KBUILD"
  else
    warn "no kernel headers found; eBPF will fall back to the userspace router"
  fi
fi
# Debian splits its headers: the arch half (build) includes the common half, which bcc finds
# through /lib/modules/$(uname -r)/source (without it: "kconfig.h not found").
KSRC=/lib/modules/$(uname -r)/source
if [ -e "$KBUILD" ] && [ ! -e "$KSRC" ]; then
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$common" ]; then
    log "linking $KSRC -> $common"
    $SUDO ln -sfn "$common" "$KSRC"
  fi
fi

# --- 3. Python virtualenv ----------------------------------------------------------------
py_ok() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null; }
PY=${FEDFAAS_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
    path=$(command -v "$cand" 2>/dev/null || true)
    if [ -n "$path" ] && py_ok "$path"; then PY=$path; break; fi
  done
fi
[ -n "$PY" ] || die "need Python >= 3.11 with venv (Debian 12: apt-get install python3 python3-venv)"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.fedfaas-deps"
UV_VERSION=0.13.8
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  # uv (from PyPI, pinned) installs what pip would, in half the time (fetched, unpacked and
  # compiled in parallel; cold caches on 2 cores, one after the other: pip 110 s, uv 52 s):
  # the same resolution (no pre-releases, as pip; without that flag it once took sympy 1.14.0rc1),
  # pip itself upgraded, bytecode compiled at install time as pip does (else, where
  # PYTHONDONTWRITEBYTECODE is set, every process compiles torch's modules again), the system's
  # CA bundle as pip's (--native-tls); its cache under $CACHE/uv (hard links into the venv).
  # flwr pins uv < 0.12, so the venv ends with that uv, as it does with pip.
  log "installing Python dependencies with uv (first run downloads torch: about a minute)"
  "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION"
  UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE/uv} "$VENV/bin/uv" pip install -q --native-tls \
    --compile-bytecode --prerelease=disallow --upgrade-package pip \
    --python "$VENV/bin/python" -e ".[dev,bench,torch]" pip
  echo "$want" >"$STAMP"
fi
# bcc's Python bindings come from Debian (ctypes over libbcc); expose only that package.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$SITE/bcc" ]; then
  ln -s /usr/lib/python3/dist-packages/bcc "$SITE/bcc"
fi

# --- 4. Go-built binaries: MinIO (required), helm (for the chart tests) ------------------------
have_bin() { command -v "$1" >/dev/null || [ -x "$CACHE/bin/$1" ] || [ -x "$CACHE/gobin/$1" ]; }
find_go() {
  command -v go >/dev/null && return 0
  [ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin && return 0
  return 1
}
go_ok() {  # Go >= 1.21 can fetch the toolchain a module needs from the module proxy
  find_go || return 1
  local v
  v=$(go env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 1 ] || [ "$2" -ge 21 ]; }
}
go_build() {  # go_build NAME MODULE MESSAGE
  log "$3"
  mkdir -p "$CACHE/bin"
  GOBIN="$CACHE/bin" GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto} go install "$2"
}
if ! have_bin minio; then
  go_ok || die "MinIO is not on PATH and building it needs Go >= 1.21 (Debian 12's golang-go is
  1.19): install Go from https://go.dev/dl into /usr/local/go, or put a \`minio\` binary on PATH
  or in $CACHE/bin, then run \`make setup\` again"
  go_build minio github.com/minio/minio@latest \
    "building MinIO with go install (about 5 minutes on 2 cores, cached in $CACHE/bin)"
fi
if [ -z "${FEDFAAS_SKIP_HELM:-}" ] && ! have_bin helm; then
  if go_ok; then
    go_build helm helm.sh/helm/v3/cmd/helm@latest \
      "building helm with go install (about 3 minutes on 2 cores; FEDFAAS_SKIP_HELM=1 skips)" \
      || warn "helm build failed; the chart's helm tests will be skipped (make helm retries)"
  else
    warn "no Go >= 1.21: helm not built; the chart's helm tests will be skipped"
  fi
fi
minio_at=$(command -v minio || true)
for cand in "$CACHE/bin/minio" "$CACHE/gobin/minio"; do
  [ -n "$minio_at" ] || { [ -x "$cand" ] && minio_at=$cand; } || true
done
log "ready: $VENV, minio at $minio_at"
