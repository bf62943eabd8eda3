#!/usr/bin/env bash
# Installs everything FedFaaS needs on Debian 12 (root, package registries only).
# Idempotent: each step checks first, so a second run takes seconds.
#   apt: redis-server, python3-bpfcc, kernel headers (+ the link bcc looks for)
#   .venv: the Python dependencies (torch and torchvision from PyPI), the project in editable mode
#   MinIO: built with `go install github.com/minio/minio@latest` into a cache folder, unless on PATH
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VENV=${FEDFAAS_VENV:-$ROOT/.venv}
log() { printf '[setup] %s\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# --- 1. Debian packages ------------------------------------------------------------------
APT_PKGS="redis-server python3-bpfcc bpfcc-tools linux-headers-amd64 python3-venv python3-pip curl ca-certificates iproute2"
missing=""
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $missing >/dev/null
fi

# --- 2. Kernel headers where bcc looks for them --------------------------------------------
# bcc compiles against /lib/modules/$(uname -r)/build. A cloud kernel seldom ships its own
# headers; SK_MSG programs use only stable UAPI types, so Debian's installed headers serve.
KBUILD=/lib/modules/$(uname -r)/build
if [ ! -e "$KBUILD" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$hdr" ]; then
    log "linking $KBUILD -> $hdr"
    $SUDO mkdir -p "$(dirname "$KBUILD")"
    $SUDO ln -sfn "$hdr" "$KBUILD"
  else
    log "no kernel headers found; eBPF will fall back to the userspace router"
  fi
fi

# --- 3. Python virtualenv ----------------------------------------------------------------
PY=${FEDFAAS_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
      PY=$(command -v "$cand"); break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: need Python >= 3.11" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.fedfaas-deps"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  log "installing Python dependencies (first run downloads torch: several minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[dev,bench]"
  echo "$want" >"$STAMP"
fi
# bcc's Python bindings come from Debian (ctypes over libbcc); expose only that package.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$SITE/bcc" ]; then
  ln -s /usr/lib/python3/dist-packages/bcc "$SITE/bcc"
fi

# --- 4. MinIO ------------------------------------------------------------------------------
if ! command -v minio >/dev/null && [ ! -x "$CACHE/bin/minio" ]; then
  command -v go >/dev/null || { [ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin; }
  command -v go >/dev/null || { echo "setup: Go is needed to build MinIO (go install github.com/minio/minio@latest)" >&2; exit 1; }
  log "building MinIO with go install (about 5 minutes on 2 cores, cached in $CACHE/bin)"
  mkdir -p "$CACHE/bin"
  GOBIN="$CACHE/bin" GOFLAGS=-mod=mod go install github.com/minio/minio@latest
fi
log "ready: $VENV, minio at $(command -v minio || echo "$CACHE/bin/minio")"
