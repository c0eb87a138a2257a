#!/usr/bin/env bash
# CI piece: the UCX transport tests in their own venv with the ucx extra (kvblocks-ucx, built from
# ucx/ against the libucx-cu12 wheel). Runs tests/test_ucx.py (every UCX_TLS set it covers), the
# two-host test (which includes UCX), the exposure test (a raw UCP client against every UCX mode; needs
# root for network namespaces) and the data-path tests (auto with UCX loaded). Exits non-zero
# on failure, when pytest collects nothing, or when the UCX tests were skipped.
# Also runs the ucx cases of the backend contract suite (tests/contract; the others run in .ci/run).
# Env: VENV (default .venv-ucx-ci at the checkout root), KEEP_VENV=1 to reuse an existing one,
# KVBLOCKS_WHEEL (set by .ci/run: the run's wheel; else kvblocks is built from this checkout).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=.ci/lib.sh
. .ci/lib.sh
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv-ucx-ci}
t0=$(date +%s)

ci_venv "$VENV" || exit 1
# ./ucx provides kvblocks-ucx, which the ucx extra names
ci_install ./ucx ucx,test || { echo "ci/ucx: installing kvblocks[ucx,test] failed" >&2; exit 1; }
t1=$(date +%s)
echo "ci/ucx: install took $((t1 - t0)) s; venv size $(du -sh "$VENV" | cut -f1)"

# test_ucx, and the contract suite's ucx cases, must run: none of them skipped
ci_pytest ucx --only '(^|\.)test_ucx::|\[ucx\]$|\[ucx-' -- \
  "$ROOT/tests/test_ucx.py" "$ROOT/tests/test_ucx_exposure.py" "$ROOT/tests/test_two_hosts.py" \
  "$ROOT/tests/test_data_paths.py" "$ROOT/tests/contract" -k "ucx or not test_contract" -q -p no:cacheprovider -rs
rc=$?
echo "ci/ucx: total $(($(date +%s) - t0)) s"
exit "$rc"
