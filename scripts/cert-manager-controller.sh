#!/usr/bin/env bash
# cert-manager's controller, built from the Go module proxy and cached as the Kubernetes binaries
# are (scripts/k8s-binaries.sh). Upstream's cert-manager-controller is the module
# github.com/cert-manager/cert-manager/cmd/controller, which the proxy does not serve (it has no
# tag of its own: .../cmd/controller/@v/list is 404), so a wrapper module requires the main
# module github.com/cert-manager/cert-manager at the version and builds
# scripts/cert-manager-controller/main.go: cert-manager's own control loops (pkg/controller)
# for Certificates and for CA and SelfSigned Issuers, unchanged, in a small main of ours.
# Every module downloaded is checked by the go command against the checksum database
# (sum.golang.org, through the proxy) before it enters go.sum, and `go mod verify` checks the
# module cache again before the build.
#
#   scripts/cert-manager-controller.sh      the last line printed is the binary's path
#
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas), FEDFAAS_CERT_MANAGER_VERSION (default
# v1.19.2, as scripts/cert-manager-crds.sh), GOPROXY/GOSUMDB as the go command reads them.
set -euo pipefail
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VERSION=${FEDFAAS_CERT_MANAGER_VERSION:-v1.19.2}
OUT=$CACHE/cert-manager/$VERSION
BIN=$OUT/cert-manager-controller
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE=github.com/cert-manager/cert-manager
log() { printf '[cert-manager-controller] %s\n' "$*" >&2; }
die() { printf '[cert-manager-controller] error: %s\n' "$*" >&2; exit 1; }

[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "FEDFAAS_CERT_MANAGER_VERSION=$VERSION is not vMAJOR.MINOR.PATCH (e.g. v1.19.2)"
if [ -x "$BIN" ] && cmp -s "$HERE/cert-manager-controller/main.go" "$OUT/controller-src/main.go"
then
  echo "$BIN"
  exit 0
fi
if ! command -v go >/dev/null; then
  [ -x /usr/local/go/bin/go ] || die "building cert-manager needs Go >= 1.25 (Debian 12's golang-go
  is 1.19): install Go from https://go.dev/dl into /usr/local/go"
  export PATH=$PATH:/usr/local/go/bin
fi
[ "$(go env GOSUMDB)" != off ] || die "GOSUMDB=off: the downloads would not be checked"

start=$(date +%s)
src=$OUT/controller-src
rm -rf "$src"
mkdir -p "$src"
cp "$HERE/cert-manager-controller/main.go" "$src/main.go"
upstream=$(go mod download -json "$MODULE@$VERSION") \
  || die "cannot download $MODULE@$VERSION (checked against the checksum database): $upstream"
gomod=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <<<"$upstream")
{
  echo "module fedfaas.local/cert-manager-controller"
  echo
  grep -E '^go ' "$gomod"  # cert-manager's language version
  echo
  echo "require $MODULE $VERSION"
} >"$src/go.mod"
log "resolving $MODULE@$VERSION's dependencies from the Go module proxy"
(cd "$src" && GOFLAGS=-mod=mod go mod tidy) || die "go mod tidy failed (see above)"
(cd "$src" && go mod verify >&2) || die "go mod verify failed: the module cache was altered"
commit=$(curl -fsSL "$(go env GOPROXY | cut -d, -f1)/$MODULE/@v/$VERSION.info" \
  | sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' || true)
ldflags="-s -w -X $MODULE/pkg/util.AppVersion=$VERSION -X $MODULE/pkg/util.AppGitCommit=$commit"
log "building cert-manager's controller $VERSION (several minutes on 2 cores)"
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
  go build -trimpath -ldflags "$ldflags" -o "$BIN.tmp" .) || die "go build failed (see above)"
mv "$BIN.tmp" "$BIN"
log "built in $(( $(date +%s) - start )) s: $("$BIN" --version)"
echo "$BIN"
