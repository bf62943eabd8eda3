#!/usr/bin/env bash
# `make test-all`, the full run as CI runs it (.ci/run): each tier in turn, each run even when one
# before it failed, its time printed; exits 1 naming the tiers that failed.
#   TIERS  the tiers to run (default: test test-slow test-containers test-k8s)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TIERS=${TIERS:-test test-slow test-containers test-k8s}
failed=()
for tier in $TIERS; do
    start=$(date +%s)
    echo "== make $tier"
    make --no-print-directory "$tier" || failed+=("$tier")
    echo "== make $tier: $(($(date +%s) - start)) s"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "test-all: failed: ${failed[*]}" >&2
    exit 1
fi
echo "test-all: every tier passed"
