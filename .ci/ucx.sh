#!/usr/bin/env bash
# CI piece: the UCX transport tests in their own venv with the ucx extra (kvblocks-ucx, built from
# ucx/ against the libucx-cu12 wheel). Runs tests/test_ucx.py (every UCX_TLS set it covers), the
# two-host test (which includes UCX), the exposure test (a raw UCP client against every UCX mode; needs
# root for network namespaces) and the data-path tests (auto with UCX loaded). Exits non-zero
# on failure, when pytest collects nothing, or when the UCX tests were skipped.
# Env: VENV (default .venv-ucx-ci at the checkout root), KEEP_VENV=1 to reuse an existing one.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv-ucx-ci}
t0=$(date +%s)

if [ "${KEEP_VENV:-0}" != 1 ] || [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || exit 1
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# ./ucx provides kvblocks-ucx, which the ucx extra names
pip install -q ./ucx ".[ucx,test]" || { echo "ci/ucx: installing kvblocks[ucx,test] failed" >&2; exit 1; }
t1=$(date +%s)
echo "ci/ucx: install took $((t1 - t0)) s; venv size $(du -sh "$VENV" | cut -f1)"

cd /
report=$(mktemp)
pytest "$ROOT/tests/test_ucx.py" "$ROOT/tests/test_ucx_exposure.py" "$ROOT/tests/test_two_hosts.py" \
  "$ROOT/tests/test_data_paths.py" -q -p no:cacheprovider \
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
ucx = [c for c in cases if c.get("classname", "").split(".")[-1] == "test_ucx"]
skipped = [c for c in ucx if c.find("skipped") is not None]
sys.exit(0 if ucx and not skipped else 1)
PY
then
  echo "ci/ucx: UCX tests were skipped (is kvblocks-ucx installed in $VENV?)" >&2
  rc=1
fi
rm -f "$report"
exit "$rc"
