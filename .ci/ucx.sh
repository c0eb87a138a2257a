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

cd /
report=$(mktemp)
pytest "$ROOT/tests/test_ucx.py" "$ROOT/tests/test_ucx_exposure.py" "$ROOT/tests/test_two_hosts.py" \
  "$ROOT/tests/test_data_paths.py" "$ROOT/tests/contract" -k "ucx or not test_contract" -q -p no:cacheprovider \
  -rs --junitxml="$report"
rc=$?
t2=$(date +%s)
echo "ci/ucx: tests took $((t2 - t1)) s; total $((t2 - t0)) s"
if [ "$rc" = 5 ]; then
  echo "ci/ucx: pytest collected no tests" >&2
  rm -f "$report"
  exit 1
fi
if [ "$rc" = 0 ] && ! python - "$report" <<'PY'
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
cases = s.iter("testcase")
# test_ucx, and the contract suite's ucx cases
ucx = [c for c in cases if c.get("classname", "").split(".")[-1] == "test_ucx" or c.get("name", "").endswith("[ucx]")
       or "[ucx-" in c.get("name", "")]
skipped = [c for c in ucx if c.find("skipped") is not None]
sys.exit(0 if ucx and not skipped else 1)
PY
then
  echo "ci/ucx: UCX tests were skipped (is kvblocks-ucx installed in $VENV?)" >&2
  rc=1
fi
rm -f "$report"
exit "$rc"
