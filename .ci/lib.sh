# shellcheck shell=bash
# Shared by .ci/run and its parts (.ci/vllm.sh, .ci/ucx.sh, ...): venvs, the one kvblocks wheel of a
# run, and timed parts with a table at the end. Source it; it changes no shell option.
#
#   ci_begin                 start of .ci/run: a fresh times file and load sampler
#   ci_part NAME CMD...      runs CMD as part NAME: prints and records exit, wall and CPU seconds, load
#   ci_bg NAME CMD...        ci_part in the background at nice $CI_BG_NICE (default 5: foreground parts
#                            keep their timing; 10 starved them behind other users of a shared machine),
#                            its output in build/ci-NAME.log, shown by ci_wait
#   ci_wait                  waits for the background parts, shows their output, records failures
#   ci_end                   the time table; returns non-zero when a part failed
#   ci_venv DIR              a fresh venv at DIR (reused with KEEP_VENV=1), activated; made by uv, with pip
#                            in it, when ci_get_uv got uv
#   ci_get_uv                installs uv for this run into build/ci-uv (CI_NO_UV=1: pip only)
#   ci_pip ARGS...           pip ARGS in the active venv, run by uv when ci_get_uv got it, else by pip
#   ci_install SPEC EXTRAS   ci_pip install kvblocks[EXTRAS]: the run's wheel ($KVBLOCKS_WHEEL) when set,
#                            else built from this checkout; SPEC: more requirements (may be empty)
#   ci_wheel                 builds the run's wheel once into $CI_DIST (a part: runs in a subshell); marks
#                            build/ci-wheel.ready or build/ci-wheel.failed when done
#   ci_wait_wheel            in a part started before the wheel part ended: waits for that mark, then
#                            ci_use_wheel; fails when the wheel failed
#   ci_use_wheel             exports KVBLOCKS_WHEEL, the wheel ci_wheel built
#   ci_pytest NAME [RULE...] -- ARGS...
#                            pytest ARGS from / (so the venv's installed kvblocks is imported, not the
#                            source tree) with a junit report; fails when pytest fails, collects nothing
#                            (exit 5) or the report breaks the skip rule. RULE: --only REGEX (count only
#                            tests whose "classname::name" matches), --min-run N (at least N of them ran;
#                            default 1), --max-skips N (at most N skipped; default 0), --ignore-skip TEXT
#                            (skips whose reason contains TEXT are not counted)

CI_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CI_DIST=${CI_DIST:-$CI_ROOT/build/ci-dist}
CI_TIMES=${CI_TIMES:-$CI_ROOT/build/ci-times.tsv}
CI_LOADS=${CI_LOADS:-$CI_ROOT/build/ci-loads.txt}
CI_SHARES=${CI_SHARES:-$CI_ROOT/build/ci-shares.txt}
CI_WHEEL_MARK=$CI_ROOT/build/ci-wheel
CI_FAILED=${CI_FAILED:-}

ci_log() { echo "ci: $*" >&2; }

# CPU time (user + system, clock ticks) of the children shell $1 has waited for.
ci_cpu_ticks() { awk '{print $16 + $17}' "/proc/$1/stat"; }

ci_begin() {
  mkdir -p "$(dirname "$CI_TIMES")"
  : > "$CI_TIMES"
  : > "$CI_LOADS"
  : > "$CI_SHARES"
  rm -f "$CI_WHEEL_MARK.ready" "$CI_WHEEL_MARK.failed"
  # The machine may be shared. Every 5 s: the 1-minute load, and the share of a core a thread of this
  # priority gets (.ci/cpu_share.py); the table gives each part's mean load and an idle estimate.
  (while :; do echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg)" >> "$CI_LOADS"; sleep 5; done) &
  CI_SAMPLER=$!
  python3 "$CI_ROOT/.ci/cpu_share.py" 5 >> "$CI_SHARES" &
  CI_PROBE=$!
  CI_START=$(date +%s)
}

ci_part() {
  local name=$1 t0 t1 cpu rc out
  shift
  out="$CI_ROOT/build/.ci-part-$BASHPID"
  t0=$(date +%s)
  ci_log "=== part $name: start at $(date -u +%H:%M:%S) (load $(cut -d' ' -f1 /proc/loadavg))"
  # In a subshell that reports its own children's CPU time: this shell's would also count the
  # background parts it reaps meanwhile.
  ( "$@"; rc=$?; me=$BASHPID; ci_cpu_ticks "$me" > "$out"; exit "$rc" )
  rc=$?
  t1=$(date +%s)
  cpu=$(( $(cat "$out" 2>/dev/null || echo 0) / $(getconf CLK_TCK) ))
  rm -f "$out"
  local load
  load=$(awk -v a="$t0" -v b="$t1" -v now="$(cut -d' ' -f1 /proc/loadavg)" \
    '$1 >= a && $1 <= b {s += $2; n++} END {printf "%.1f", n ? s / n : now}' "$CI_LOADS" 2>/dev/null)
  # the mean share of a core a spinning thread of this priority got (1.0: the machine had a free core)
  local share
  share=$(awk -v a="$t0" -v b="$t1" '$1 >= a && $1 <= b {s += $2; n++} END {printf "%.2f", n ? s / n : 1}' \
    "$CI_SHARES" 2>/dev/null)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((t1 - t0))" "$cpu" "$load" \
    "${share:-1}" "${CI_MODE:-fg}" >> "$CI_TIMES"
  ci_log "=== part $name: exit $rc after $((t1 - t0)) s (CPU $cpu s, mean load $load)"
  [ "$rc" = 0 ] || CI_FAILED="$CI_FAILED $name"
  return "$rc"
}

CI_BG=()
ci_bg() {
  local name=$1
  ci_log "=== part $name: in the background (output: build/ci-$name.log)"
  (renice -n "${CI_BG_NICE:-5}" "$BASHPID" >/dev/null; CI_MODE=bg ci_part "$@") > "$CI_ROOT/build/ci-$name.log" 2>&1 &
  CI_BG+=("$name:$!")
}

ci_wait() {
  local entry name pid
  for entry in "${CI_BG[@]}"; do
    name=${entry%%:*}; pid=${entry##*:}
    wait "$pid" || CI_FAILED="$CI_FAILED $name"
    ci_log "=== output of the background part $name:"
    cat "$CI_ROOT/build/ci-$name.log"
  done
  CI_BG=()
}

ci_end() {
  [ -n "${CI_SAMPLER:-}" ] && kill "$CI_SAMPLER" 2>/dev/null
  [ -n "${CI_PROBE:-}" ] && kill "$CI_PROBE" 2>/dev/null
  local cores
  cores=$(nproc)
  echo
  echo "ci: time table ($cores cores). 'share': the mean share of a core a spinning thread got during the"
  echo "ci: part (.ci/cpu_share.py; 1.00 on an idle machine, less when the machine is shared). A part"
  echo "ci: needs at least CPU / $cores s; background parts (bg) overlap the foreground ones."
  awk -F'\t' -v cores="$cores" -v total="$(($(date +%s) - CI_START))" '
    BEGIN { printf "%-14s %5s %7s %7s %6s %6s\n", "part", "exit", "wall s", "CPU s", "load", "share" }
    { printf "%-14s %5s %7d %7d %6s %6s\n", $1 ($7 == "bg" ? " (bg)" : ""), $2, $3, $4, $5, $6; c += $4 }
    END { printf "%-14s %5s %7d %7d\n", "total", "", total, c }' "$CI_TIMES"
  if [ -n "$CI_FAILED" ]; then
    ci_log "failed parts:$CI_FAILED"
    return 1
  fi
}

ci_venv() {
  local dir=$1
  if [ "${KEEP_VENV:-0}" != 1 ] || [ ! -x "$dir/bin/python" ]; then
    rm -rf "$dir"
    if ci_have_uv; then
      # --seed: pip in it too (the README's command and some tests run pip)
      "$CI_UV" venv -q --seed --python "$(command -v python3)" "$dir" || return 1
    else
      python3 -m venv "$dir" || return 1
      "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    fi
  fi
  # shellcheck disable=SC1091
  . "$dir/bin/activate"
}

# uv, installed once per run (ci_get_uv, the run's first part), makes the venvs and installs into them
# (kvblocks[test] from the run's wheel: 234 s and 29 s of CPU with pip, 5 s and 1 s with uv, at load 15).
# Without it (CI_NO_UV=1, or uv not installable) everything falls back to pip.
CI_UV=$CI_ROOT/build/ci-uv/bin/uv
ci_have_uv() { [ "${CI_NO_UV:-0}" != 1 ] && [ -x "$CI_UV" ] && ci_uv_env; }

ci_get_uv() {
  [ "${CI_NO_UV:-0}" = 1 ] && return 0
  rm -rf "$CI_ROOT/build/ci-uv"
  if python3 -m pip install -q --target "$CI_ROOT/build/ci-uv" uv && "$CI_UV" --version >/dev/null; then
    ci_log "installs with $("$CI_UV" --version)"
  else
    ci_log "uv is not installable here: installs with pip"
    rm -rf "$CI_ROOT/build/ci-uv"
  fi
}

ci_pip() {  # pip ARGS... into the active venv, by uv when there is one
  if ci_have_uv && [ "$1" = install ]; then
    # uv keys its cache of a local source tree's build by pyproject.toml/setup.py times only: always
    # rebuild this repository's packages (a C++ change leaves those times alone)
    shift
    "$CI_UV" pip install --refresh-package kvblocks --refresh-package kvblocks-ucx "$@"
  elif ci_have_uv; then
    "$CI_UV" pip "$@"
  else
    python -m pip "$@"
  fi
}

ci_wheel() {
  rm -rf "$CI_DIST"
  # In-tree build: it reuses build/ from the README part's install, so this is packaging only.
  if ! python3 -m pip wheel -q --no-deps -w "$CI_DIST" "$CI_ROOT" || ! KVBLOCKS_WHEEL=$(ls "$CI_DIST"/kvblocks-*.whl); then
    touch "$CI_WHEEL_MARK.failed"
    return 1
  fi
  export KVBLOCKS_WHEEL
  ci_log "wheel: $KVBLOCKS_WHEEL ($(du -k "$KVBLOCKS_WHEEL" | cut -f1) KiB)"
  touch "$CI_WHEEL_MARK.ready"
}

ci_wait_wheel() {
  while [ ! -e "$CI_WHEEL_MARK.ready" ] && [ ! -e "$CI_WHEEL_MARK.failed" ]; do sleep 2; done
  [ -e "$CI_WHEEL_MARK.ready" ] && ci_use_wheel
}

ci_use_wheel() {
  KVBLOCKS_WHEEL=$(ls "$CI_DIST"/kvblocks-*.whl) || return 1
  export KVBLOCKS_WHEEL
}

ci_install() {
  local more=$1 extras=$2
  # shellcheck disable=SC2086
  if [ -n "${KVBLOCKS_WHEEL:-}" ]; then
    ci_pip install -q $more "kvblocks[$extras] @ file://$KVBLOCKS_WHEEL"
  else
    ci_pip install -q $more "$CI_ROOT[$extras]"
  fi
}

ci_pytest() {
  local name=$1 only="" min_run=1 max_skips=0 ignore="" report rc t0
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in
      --only) only=$2 ;;
      --min-run) min_run=$2 ;;
      --max-skips) max_skips=$2 ;;
      --ignore-skip) ignore=$2 ;;
      *) ci_log "ci_pytest: unknown rule $1"; return 2 ;;
    esac
    shift 2
  done
  shift
  report=$(mktemp)
  t0=$(date +%s)
  (cd / && pytest "$@" --junitxml="$report")
  rc=$?
  echo "ci/$name: tests took $(($(date +%s) - t0)) s"
  if [ "$rc" = 5 ]; then
    ci_log "$name: pytest collected no tests"
    rc=1
  elif [ "$rc" = 0 ] && ! python - "$report" "$only" "$min_run" "$max_skips" "$ignore" <<'PY'
import re, sys, xml.etree.ElementTree as ET
report, only, min_run, max_skips, ignore = sys.argv[1:]
cases = [c for c in ET.parse(report).getroot().iter("testcase")
         if re.search(only, c.get("classname", "") + "::" + c.get("name", ""))]
skips = [s for s in (c.find("skipped") for c in cases) if s is not None]
counted = [s for s in skips if not (ignore and ignore in s.get("message", ""))]
ran = len(cases) - len(skips)
print(f"skip rule: {ran} ran (at least {min_run}), {len(counted)} skipped (at most {max_skips})"
      + (f" and {len(skips) - len(counted)} allowed skips ('{ignore}')" if ignore else ""))
sys.exit(0 if ran >= int(min_run) and len(counted) <= int(max_skips) else 1)
PY
  then
    ci_log "$name: the skip rule failed: tests were skipped or too few ran (is what they test importable in $(command -v python)?)"
    rc=1
  fi
  rm -f "$report"
  return "$rc"
}

ci_uv_env() {  # uv reads no pip configuration: give it pip's indexes, links, constraints and certificate
  [ -n "${CI_UV_ENV:-}" ] && return 0
  local key val
  while IFS='=' read -r key val; do
    val=${val#\'} && val=${val%\'}
    case ${key##*.} in
      index-url) export UV_DEFAULT_INDEX=$val ;;
      extra-index-url) export UV_EXTRA_INDEX_URL=$val ;;
      find-links) export UV_FIND_LINKS=${val// /,} ;;
      constraint) export UV_CONSTRAINT=$val ;;
      cert) export SSL_CERT_FILE=$val ;;
    esac
  done < <(python3 -m pip config list 2>/dev/null)
  export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}  # as pip: the best version over all indexes
  # as pip: compile the .pyc files at install; else the first import of torch and transformers (a test's
  # checkpoint writer, with a 300 s timeout) compiles them, which took over 300 s at load 20
  export UV_COMPILE_BYTECODE=${UV_COMPILE_BYTECODE:-1}
  CI_UV_ENV=1
}
