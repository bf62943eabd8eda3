#!/usr/bin/env bash
# `make test-all`, the full run as CI runs it (.ci/run): each tier in turn, each run even when one
# before it failed, its time printed; exits 1 naming the tiers that failed.
#   TIERS  the tiers to run (default: test test-slow test-containers test-k8s)
#
# On a fresh machine the Kubernetes tier's binaries take about 20 minutes of compiling on 2 cores
# (scripts/k8s-binaries.sh: kube-apiserver alone about 10). The slow and container tiers run one
# test at a time and leave a core mostly idle, so when test-k8s comes after one of them the
# binaries are built in the background from the first of them on, at the lowest CPU and I/O
# priority (the tests come first), and test-k8s waits for that build: its log is printed then.
# A build that failed there is only reported: `make test-k8s` builds what is missing again, in
# the foreground, as without it. Where the binaries are cached the build finds them at once.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TIERS=${TIERS:-test test-slow test-containers test-k8s}
read -r -a tiers <<<"$TIERS"
failed=()
build_pid=""
build_log=""

# whether test-k8s comes after tier number $1 of $TIERS
k8s_later() {
    local i
    for ((i = $1 + 1; i < ${#tiers[@]}; i++)); do
        [ "${tiers[$i]}" = test-k8s ] && return 0
    done
    return 1
}

start_k8s_build() {
    # test-slow's own prerequisite first, in the foreground: it may apt-get install Chromium,
    # and two apt-gets at once fail on dpkg's lock (the build apt-gets etcd-server, iptables)
    [ "$1" != test-slow ] || make --no-print-directory browser
    build_log=$(mktemp /tmp/fedfaas-k8s-binaries.XXXXXX.log)
    echo "== make k8s-binaries, in the background (log: $build_log)"
    local idle_io=(ionice -c 3)
    "${idle_io[@]}" true 2>/dev/null || idle_io=()  # no I/O classes here: CPU priority only
    nice -n 19 "${idle_io[@]}" make --no-print-directory k8s-binaries >"$build_log" 2>&1 &
    build_pid=$!
}

wait_k8s_build() {
    local start rc
    start=$(date +%s)
    wait "$build_pid"
    rc=$?
    echo "== make k8s-binaries (background): exit $rc, waited $(($(date +%s) - start)) s"
    cat "$build_log"
    rm -f "$build_log"
    build_pid=""
}

for i in "${!tiers[@]}"; do
    tier=${tiers[$i]}
    start=$(date +%s)
    echo "== make $tier"
    if [ -z "$build_pid" ] && { [ "$tier" = test-slow ] || [ "$tier" = test-containers ]; } &&
        k8s_later "$i"; then
        start_k8s_build "$tier"
    fi
    # a background build that failed is only reported: test-k8s builds what is missing again
    [ "$tier" != test-k8s ] || [ -z "$build_pid" ] || wait_k8s_build
    make --no-print-directory "$tier" || failed+=("$tier")
    echo "== make $tier: $(($(date +%s) - start)) s"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "test-all: failed: ${failed[*]}" >&2
    exit 1
fi
echo "test-all: every tier passed"
