#!/usr/bin/env bash
# faasd 0.19.0 on this machine without touching it: containerd, `faasd up` and `faasd provider`
# in a private pid+mount+net namespace of their own, as a faasd host runs them under systemd.
#
#   scripts/faasd-up.sh RUN_DIR
#
# runs in the foreground until SIGTERM or SIGINT (or until containerd, `faasd up` or the
# provider exits), then stops faasd's services; everything it started dies with the namespace.
# This script is the namespace's PID 1 (it re-runs itself under `unshare` first). Inside:
#   /run, /dev/shm               private tmpfs (containerd's socket and state; the node
#                                gateways' object stores)
#   /var/lib                     overlay, writes in RUN_DIR/ovl/var-lib/upper: faasd's
#                                /var/lib/faasd (fill RUN_DIR/ovl/var-lib/upper/faasd first:
#                                deploy/faasd/prepare.py, plus `hosts` and `resolv.conf`),
#                                /var/lib/faasd-provider, CNI's leases
#   /usr/local/bin               overlay: `faasd` there is the log driver containerd's shim runs
#                                for every container (faasd hard-codes that path; its own
#                                writes to journald, absent here): a file logger instead, each
#                                container's output in RUN_DIR/logs/containers/<ns>/<name>.log
#   /opt/cni/bin, /etc/cni/net.d /usr/lib/cni (Debian's CNI plugins), and RUN_DIR/cni
#   /etc/hosts                   /var/lib/faasd/hosts: the services' names (faasd writes them),
#                                so that a process entering the namespace resolves them too
#   network                      loopback and faasd's bridge openfaas0 (10.62.0.0/16) only
# containerd runs with its root in RUN_DIR/containerd (or $FEDFAAS_FAASD_CONTAINERD_ROOT, kept
# from run to run: its images are imported once) and its socket where faasd expects it
# (/run/containerd/containerd.sock). Each line "NAMESPACE IMAGE" of RUN_DIR/images.list is
# copied from podman's store (scripts/containers-env.sh) into that containerd namespace
# (`openfaas` for compose services, `openfaas-fn` for functions) before faasd starts, unless
# that root already holds the same image (podman's image id). Logs:
# RUN_DIR/logs/{containerd,faasd-up,faasd-provider}.log. RUN_DIR/started appears once faasd
# and its provider run. faasd names its containers' cgroups /openfaas/<name> and
# /openfaas-fn/<name> under each controller: run one at a time per machine, and rmdir them after.
#
# Environment: FEDFAAS_FAASD (faasd binary; default ~/.cache/fedfaas/bin/faasd, unpacked by
# tests/containers/faasd_harness.py from ../shared/openfaas/bin/faasd.xz),
# FEDFAAS_FAASD_CONTAINERD_ROOT (see above; one run at a time may use a root).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
RUN=$(realpath "$1")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ "$$" != 1 ]; then
    # --propagation private: no mount made inside reaches the host
    exec unshare --mount --net --pid --fork --mount-proc --propagation private \
        bash "$HERE/faasd-up.sh" "$RUN"
fi

FAASD=${FEDFAAS_FAASD:-$HOME/.cache/fedfaas/bin/faasd}
LOG=$RUN/logs
mkdir -p "$LOG/containers"
log() { printf 'faasd-up: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
[ -x "$FAASD" ] || die "no faasd binary at $FAASD (set FEDFAAS_FAASD)"
for tool in containerd ctr runc podman ip; do
    command -v "$tool" >/dev/null || die "$tool is not installed (scripts/setup.sh installs it)"
done
[ -d /usr/lib/cni ] ||
    die "no CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)"
[ -f "$RUN/ovl/var-lib/upper/faasd/docker-compose.yaml" ] ||
    die "no $RUN/ovl/var-lib/upper/faasd/docker-compose.yaml: run deploy/faasd/prepare.py first"

# --- private file system ----------------------------------------------------------------------
overlay() {  # overlay DIR NAME: DIR as it is, with every write going to RUN/ovl/NAME/upper
    mkdir -p "$RUN/ovl/$2/upper" "$RUN/ovl/$2/work"
    mount -t overlay "ovl-$2" \
        -o "lowerdir=$1,upperdir=$RUN/ovl/$2/upper,workdir=$RUN/ovl/$2/work" "$1"
}
bind_dir() {  # bind_dir SOURCE TARGET: TARGET shows SOURCE (made in an overlay if missing)
    local parent
    if [ ! -d "$2" ]; then
        parent=$2
        while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
        overlay "$parent" "$(echo "${parent#/}" | tr / -)"
        mkdir -p "$2"
    fi
    mount --bind "$1" "$2"
}
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
overlay /var/lib var-lib
overlay /usr/local/bin usr-local-bin
mkdir -p "$RUN/cni"
bind_dir /usr/lib/cni /opt/cni/bin
bind_dir "$RUN/cni" /etc/cni/net.d
[ -f /var/lib/faasd/hosts ] || printf '127.0.0.1\tlocalhost\n' >/var/lib/faasd/hosts
[ -f /var/lib/faasd/resolv.conf ] || printf 'nameserver 127.0.0.1\n' >/var/lib/faasd/resolv.conf
mount --bind /var/lib/faasd/hosts /etc/hosts

# containerd's binary log driver protocol (cio.BinaryIO): the container's stdout on fd 3, its
# stderr on fd 4; the driver says it is ready by closing fd 5 (every copy of it)
cat >/usr/local/bin/faasd <<EOF
#!/bin/sh
dir="$LOG/containers/\${CONTAINER_NAMESPACE:-unknown}"
mkdir -p "\$dir"
cat <&3 3<&- 4<&- 5>&- >>"\$dir/\$CONTAINER_ID.log" &
cat <&4 3<&- 4<&- 5>&- >>"\$dir/\$CONTAINER_ID.log" &
exec 3<&- 4<&- 5>&-
wait
EOF
chmod 0755 /usr/local/bin/faasd

ip link set lo up

# --- containerd --------------------------------------------------------------------------------
ROOT_DIR=${FEDFAAS_FAASD_CONTAINERD_ROOT:-$RUN/containerd}
mkdir -p "$ROOT_DIR"
cat >"$RUN/containerd.toml" <<EOF
version = 2
root = "$ROOT_DIR"
state = "/run/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "/run/containerd/containerd.sock"
EOF
containerd --config "$RUN/containerd.toml" >"$LOG/containerd.log" 2>&1 &
CONTAINERD=$!
for _ in $(seq 300); do
    ctr version >/dev/null 2>&1 && break
    kill -0 "$CONTAINERD" 2>/dev/null || die "containerd exited; see $LOG/containerd.log"
    sleep 0.1
done
ctr version >/dev/null 2>&1 || die "containerd did not answer in 30 s; see $LOG/containerd.log"

# --- images --------------------------------------------------------------------------------------
# A containerd root kept from an earlier run (FEDFAAS_FAASD_CONTAINERD_ROOT) holds that run's
# containers (their tasks died with it): removed, so that faasd and its provider start from none.
for ns in openfaas openfaas-fn; do
    ctr -n "$ns" containers ls -q 2>/dev/null |
        xargs -r ctr -n "$ns" containers rm >/dev/null 2>&1 || true
done
# shellcheck source=scripts/containers-env.sh
. "$HERE/containers-env.sh"
if [ -f "$RUN/images.list" ]; then
    mkdir -p "$ROOT_DIR/fedfaas-imported"
    while read -r ns image <&9; do
        [ -n "$ns" ] || continue
        id=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null) ||
            die "image $image is not in podman's store (run \`make images\`)"
        stamp=$ROOT_DIR/fedfaas-imported/$ns--${image//[\/:]/_}
        if [ "$(cat "$stamp" 2>/dev/null)" = "$id" ] &&
            ctr -n "$ns" images ls -q | grep -qxF "$image"; then
            continue  # the same image as podman's, imported by an earlier run
        fi
        log "importing $image into containerd namespace $ns"
        podman save --format oci-archive "$image" 2>"$LOG/podman-save.log" |
            ctr -n "$ns" images import --all-platforms - >>"$LOG/ctr-import.log" 2>&1 ||
            die "could not copy $image into containerd ($ns): see $LOG/podman-save.log" \
                "and $LOG/ctr-import.log"
        echo "$id" >"$stamp"
    done 9<"$RUN/images.list"
fi
ctr namespaces create openfaas-fn 2>/dev/null || true
ctr namespaces label openfaas-fn openfaas=true

# --- faasd ---------------------------------------------------------------------------------------
(cd /var/lib/faasd && exec "$FAASD" up) >"$LOG/faasd-up.log" 2>&1 &
UP=$!
mkdir -p /var/lib/faasd-provider
(cd /var/lib/faasd-provider &&
    exec env secret_mount_path=/var/lib/faasd/secrets basic_auth=true hosts_dir=/var/lib/faasd \
        "$FAASD" provider --pull-policy IfNotPresent) >"$LOG/faasd-provider.log" 2>&1 &
PROVIDER=$!

stop() {
    trap - TERM INT
    log "stopping faasd"
    kill -TERM "$UP" "$PROVIDER" 2>/dev/null || true
    # `faasd up` removes its services on SIGTERM; it gets 20 s, then the namespace ends
    for _ in $(seq 200); do
        kill -0 "$UP" 2>/dev/null || break
        sleep 0.1
    done
    kill -TERM "$CONTAINERD" 2>/dev/null || true
    exit 0
}
trap stop TERM INT
date +%s >"$RUN/started"
log "faasd up (pid $UP), provider (pid $PROVIDER), containerd (pid $CONTAINERD)"
set +e
wait -n "$UP" "$PROVIDER" "$CONTAINERD"
status=$?
for p in UP PROVIDER CONTAINERD; do
    kill -0 "${!p}" 2>/dev/null || log "$p (pid ${!p}) exited (status $status); see $LOG"
done
exit 1
