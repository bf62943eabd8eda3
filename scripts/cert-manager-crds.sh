#!/usr/bin/env bash
# cert-manager's CustomResourceDefinitions (Certificate, Issuer, ClusterIssuer, ...), from the
# Go module proxy, cached as the Kubernetes binaries are (scripts/k8s-binaries.sh): the module
# zip of github.com/cert-manager/cert-manager holds them, plain YAML, in deploy/crds/. The
# go command downloads the zip and checks it against the checksum database (sum.golang.org,
# through the proxy) before anything is read from it. The tests of the chart's cert-manager
# Certificates (tests/k8s/test_chart_on_apiserver.py, test_chart_cert_manager.py) create them in
# their API server. Nothing is built and nothing is installed on the host.
#
#   scripts/cert-manager-crds.sh          the last line printed is the folder of the CRDs
#
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas), FEDFAAS_CERT_MANAGER_VERSION (default
# v1.19.2), GOPROXY/GOSUMDB as the go command reads them.
set -euo pipefail
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VERSION=${FEDFAAS_CERT_MANAGER_VERSION:-v1.19.2}
OUT=$CACHE/cert-manager/$VERSION/crds
MODULE=github.com/cert-manager/cert-manager
log() { printf '[cert-manager-crds] %s\n' "$*" >&2; }
die() { printf '[cert-manager-crds] error: %s\n' "$*" >&2; exit 1; }

[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "FEDFAAS_CERT_MANAGER_VERSION=$VERSION is not vMAJOR.MINOR.PATCH (e.g. v1.19.2)"
if [ -s "$OUT/cert-manager.io_certificates.yaml" ]; then
  echo "$OUT"
  exit 0
fi
if ! command -v go >/dev/null; then
  [ -x /usr/local/go/bin/go ] || die "the checked download needs Go: install Go from
  https://go.dev/dl into /usr/local/go"
  export PATH=$PATH:/usr/local/go/bin
fi
[ "$(go env GOSUMDB)" != off ] || die "GOSUMDB=off: the download would not be checked"
log "downloading $MODULE@$VERSION from $(go env GOPROXY) (checked against $(go env GOSUMDB))"
# run outside any module, so that no go.mod nearby changes what is downloaded
found=$(cd / && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION") \
  || die "cannot download $MODULE@$VERSION: $found"
dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$found")
[ -s "$dir/deploy/crds/cert-manager.io_certificates.yaml" ] \
  || die "the module $MODULE@$VERSION has no Certificate CRD in deploy/crds/"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/crds"
cp "$dir"/deploy/crds/*.yaml "$tmp/crds/"
chmod u+w "$tmp"/crds/*.yaml  # the module cache's files are read-only
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mv "$tmp/crds" "$OUT"
log "$(find "$OUT" -name '*.yaml' | wc -l) CRDs in $OUT"
echo "$OUT"
