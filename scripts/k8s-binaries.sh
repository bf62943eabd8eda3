#!/usr/bin/env bash
# Builds Kubernetes server binaries from the Go module proxy and caches them (as setup.sh caches
# MinIO). k8s.io/kubernetes is a Go module whose go.mod replaces every staging module
# (k8s.io/api, k8s.io/client-go, ...) with a local folder; the proxy publishes those as
# k8s.io/X v0.MINOR.PATCH. A wrapper module requires k8s.io/kubernetes v1.MINOR.PATCH and
# replaces each staging module named in kubernetes' go.mod with its published version.
#
#   scripts/k8s-binaries.sh [NAME...]      (default: kube-apiserver kube-controller-manager)
#
# NAME is a command of k8s.io/kubernetes/cmd (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl, ...), `coredns` (github.com/coredns/coredns at
# $FEDFAAS_COREDNS_VERSION, default v1.12.1: the CoreDNS kubeadm 1.34 deploys; its go.mod has
# no replace, so `go install module@version` builds it) or `etcd`, which installs Debian's
# etcd-server (3.4; its system service stopped and disabled) instead of building anything.
# kube-proxy also gets Debian's iptables, which it runs.
# A binary already in the cache is not built again. Each build takes about 5 minutes and 1.7 GB
# on 2 cores. The last line printed is the cache folder.
#
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas), FEDFAAS_K8S_VERSION (default v1.34.12:
# 1.34 is the last minor that runs on cgroups v1 by default).
set -euo pipefail
CACHE=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}
VERSION=${FEDFAAS_K8S_VERSION:-v1.34.12}
COREDNS_VERSION=${FEDFAAS_COREDNS_VERSION:-v1.12.1}
OUT=$CACHE/k8s/$VERSION
log() { printf '[k8s-binaries] %s\n' "$*" >&2; }
die() { printf '[k8s-binaries] error: %s\n' "$*" >&2; exit 1; }

[[ $VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] \
  || die "FEDFAAS_K8S_VERSION=$VERSION is not vMAJOR.MINOR.PATCH (e.g. v1.34.12)"
MINOR=${BASH_REMATCH[1]}
STAGING_VERSION="v0.${MINOR}.${BASH_REMATCH[2]}"
[ $# -gt 0 ] || set -- kube-apiserver kube-controller-manager

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

install_iptables() {  # kube-proxy programs the node's Services with Debian's iptables
  command -v iptables-restore >/dev/null && return 0
  log "apt-get install iptables (kube-proxy's)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends iptables >/dev/null
}

install_etcd() {  # Debian's etcd-server; the tests start their own etcd, never the service
  if dpkg-query -W -f='${Status}' etcd-server 2>/dev/null | grep -q "install ok installed"; then
    return 0
  fi
  log "apt-get install etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
  else
    $SUDO service etcd stop >/dev/null 2>&1 || true
    $SUDO update-rc.d etcd disable >/dev/null 2>&1 || true
  fi
}

find_go() {
  command -v go >/dev/null && return 0
  [ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin && return 0
  die "building Kubernetes needs Go >= 1.24 (Debian 12's golang-go is 1.19): install Go from
  https://go.dev/dl into /usr/local/go"
}

write_wrapper() {  # the wrapper module in $OUT/src: require kubernetes, replace each staging module
  local src=$OUT/src mod
  mkdir -p "$src"
  [ -s "$src/go.mod" ] && return 0
  mod=$(curl -fsSL "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/$VERSION.mod") \
    || die "cannot read k8s.io/kubernetes@$VERSION's go.mod from the Go module proxy"
  {
    echo "module fedfaas.local/k8s-binaries"
    echo
    # kubernetes' own language version and GODEBUG defaults: the binaries behave as upstream's
    grep -E '^(go|godebug) ' <<<"$mod"
    echo
    echo "require k8s.io/kubernetes $VERSION"
    echo
    echo "replace ("
    # only the staging modules kubernetes requires: a replace of one nothing needs is dead
    # weight, and the proxy does not serve every sample-* module at every version
    grep -oE '^\s+k8s\.io/[A-Za-z0-9_.-]+ v0\.0\.0$' <<<"$mod" | awk '{print $1}' | sort -u \
      | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
    echo ")"
  } >"$src/go.mod.tmp"
  mv "$src/go.mod.tmp" "$src/go.mod"
}

build() {  # build NAME: k8s.io/kubernetes/cmd/NAME into $OUT/NAME
  local name=$1 start pkg=k8s.io/kubernetes/cmd/$1 ldflags v=k8s.io/component-base/version
  local cv=k8s.io/client-go/pkg/version date commit
  find_go
  write_wrapper
  start=$(date +%s)
  log "building $name $VERSION from the Go module proxy (about 5 minutes on 2 cores)"
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # upstream sets these from git (hack/lib/version.sh); without them --version says v0.0.0-master
  commit=$(curl -fsSL "$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/$VERSION.info" \
    | sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' || true)
  ldflags="-s -w"
  for p in $v $cv; do
    ldflags+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
    [ -z "$commit" ] || ldflags+=" -X $p.gitCommit=$commit"
  done
  (cd "$OUT/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
    go build -trimpath -ldflags "$ldflags" -o "$OUT/$name.tmp" "$pkg") \
    || die "go build $pkg@$VERSION failed (see above)"
  mv "$OUT/$name.tmp" "$OUT/$name"
  log "$name built in $(( $(date +%s) - start )) s: $("$OUT/$name" --version 2>&1 | head -n 1)"
}

build_coredns() {  # CoreDNS from the Go module proxy into $OUT/coredns
  local start gobin=$OUT/.gobin
  find_go
  [[ $COREDNS_VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
    || die "FEDFAAS_COREDNS_VERSION=$COREDNS_VERSION is not vMAJOR.MINOR.PATCH (e.g. v1.12.1)"
  start=$(date +%s)
  log "building coredns $COREDNS_VERSION from the Go module proxy"
  rm -rf "$gobin"
  CGO_ENABLED=0 GOBIN=$gobin GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
    go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" \
    || die "go install github.com/coredns/coredns@$COREDNS_VERSION failed (see above)"
  mv "$gobin/coredns" "$OUT/coredns"
  rmdir "$gobin"
  log "coredns built in $(( $(date +%s) - start )) s: $("$OUT/coredns" -version 2>&1 | head -n 1)"
}

mkdir -p "$OUT"
for name in "$@"; do
  case $name in
    etcd) install_etcd ;;
    coredns) [ -x "$OUT/coredns" ] || build_coredns ;;
    kube-proxy) [ -x "$OUT/$name" ] || build "$name"; install_iptables ;;
    *[!A-Za-z0-9-]*|'') die "not a Kubernetes command name: '$name'" ;;
    *) [ -x "$OUT/$name" ] || build "$name" ;;
  esac
done
echo "$OUT"
