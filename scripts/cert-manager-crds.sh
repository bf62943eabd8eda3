#!/usr/bin/env bash
# cert-manager's CustomResourceDefinitions (Certificate, Issuer, ClusterIssuer, ...), from the
# Go module proxy, cached as the Kubernetes binaries are (scripts/k8s-binaries.sh): the module
# zip of github.com/cert-manager/cert-manager holds them, plain YAML, in deploy/crds/. The
# tests of the chart's cert-manager Certificates (tests/k8s/test_chart_on_apiserver.py) create
# them in their API server. Nothing is built and nothing is installed on the host.
#
#   scripts/cert-manager-crds.sh          the last line printed is the folder of the CRDs
#
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas), FEDFAAS_CERT_MANAGER_VERSION (default
# v1.19.2), GOPROXY (default: `go env GOPROXY`, else https://proxy.golang.org; its first entry).
set -euo pipefail
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VERSION=${FEDFAAS_CERT_MANAGER_VERSION:-v1.19.2}
OUT=$CACHE/cert-manager/$VERSION/crds
log() { printf '[cert-manager-crds] %s\n' "$*" >&2; }
die() { printf '[cert-manager-crds] error: %s\n' "$*" >&2; exit 1; }

[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "FEDFAAS_CERT_MANAGER_VERSION=$VERSION is not vMAJOR.MINOR.PATCH (e.g. v1.19.2)"
if [ -s "$OUT/cert-manager.io_certificates.yaml" ]; then
  echo "$OUT"
  exit 0
fi
PROXY=${GOPROXY:-}
if [ -z "$PROXY" ] && command -v go >/dev/null; then PROXY=$(go env GOPROXY); fi
PROXY=$(cut -d, -f1 <<<"${PROXY:-https://proxy.golang.org}")
[[ $PROXY == http* ]] || die "GOPROXY's first entry ($PROXY) is not a proxy URL"
MODULE=github.com/cert-manager/cert-manager
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading $MODULE@$VERSION from $PROXY"
curl -fsSL --retry 3 -o "$tmp/module.zip" "$PROXY/$MODULE/@v/$VERSION.zip" \
  || die "cannot download $MODULE@$VERSION from $PROXY"
mkdir -p "$tmp/crds"
python3 - "$tmp/module.zip" "$MODULE@$VERSION/deploy/crds/" "$tmp/crds" <<'PY'
import sys, zipfile
from pathlib import Path
archive, prefix, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
with zipfile.ZipFile(archive) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and n.endswith(".yaml")]
    for n in names:
        (out / Path(n).name).write_bytes(z.read(n))
if not names:
    sys.exit(f"no CRDs under {prefix} in the module zip")
PY
[ -s "$tmp/crds/cert-manager.io_certificates.yaml" ] || die "the zip has no Certificate CRD"
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mv "$tmp/crds" "$OUT"
log "$(ls "$OUT" | wc -l) CRDs in $OUT"
echo "$OUT"
