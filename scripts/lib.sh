# Shared by scripts/test and scripts/demo: repository paths, phase headers, build,
# waiting for a started kstate. Sourced, not executed.
# shellcheck shell=bash

KSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Sanitizers: $KSTATE_SANITIZE (e.g. address,undefined) builds every target, tests
# included, with -fsanitize=$KSTATE_SANITIZE (CMake option KSTATE_SANITIZE). Unset, a
# build directory keeps whatever it was configured with.
KSTATE_SANITIZE=${KSTATE_SANITIZE-}
# Build directory: $KSTATE_BUILD_DIR (relative paths are taken from the repository
# root), else build-asan/ with sanitizers (their objects never mix with plain ones),
# else build/.
if [ -n "$KSTATE_SANITIZE" ]; then
  KSTATE_BUILD=${KSTATE_BUILD_DIR:-build-asan}
else
  KSTATE_BUILD=${KSTATE_BUILD_DIR:-build}
fi
case "$KSTATE_BUILD" in /*) ;; *) KSTATE_BUILD=$KSTATE_ROOT/$KSTATE_BUILD ;; esac
# The list the directory above was chosen for: kstate_build refuses another one, which
# would configure build/ with sanitizers (set KSTATE_SANITIZE before sourcing this file).
KSTATE_BUILD_SANITIZE=$KSTATE_SANITIZE

# phase TITLE: a visible header before each step.
phase() { printf '\n==> %s\n' "$*"; }

# setup: the Debian packages (compilers, libraries, JDK, Maven).
kstate_setup() {
  phase "setup: installing missing packages"
  "$KSTATE_ROOT/scripts/setup"
}

# kstate_build [TARGET...]: configures (once) and builds; no target builds everything,
# tests included.
kstate_build() {
  if [ "$KSTATE_SANITIZE" != "$KSTATE_BUILD_SANITIZE" ]; then
    echo "build: KSTATE_SANITIZE='$KSTATE_SANITIZE' but $KSTATE_BUILD was chosen for '$KSTATE_BUILD_SANITIZE'; export KSTATE_SANITIZE before sourcing scripts/lib.sh" >&2
    return 2
  fi
  phase "build: $KSTATE_BUILD (RelWithDebInfo${KSTATE_SANITIZE:+, -fsanitize=$KSTATE_SANITIZE})${*:+, targets: $*}"
  local configured=""
  if [ -f "$KSTATE_BUILD/CMakeCache.txt" ]; then
    configured=$(sed -n 's/^KSTATE_SANITIZE:STRING=//p' "$KSTATE_BUILD/CMakeCache.txt")
  fi
  if [ ! -f "$KSTATE_BUILD/build.ninja" ]; then
    cmake -S "$KSTATE_ROOT" -B "$KSTATE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKSTATE_WERROR=ON -DKSTATE_SANITIZE="$KSTATE_SANITIZE"
  elif [ -n "$KSTATE_SANITIZE" ] && [ "$KSTATE_SANITIZE" != "$configured" ]; then
    # Changing the list changes every compile command: ninja rebuilds everything.
    cmake -S "$KSTATE_ROOT" -B "$KSTATE_BUILD" -DKSTATE_SANITIZE="$KSTATE_SANITIZE"
  fi
  # -j2: a C++20 translation unit with Beast or RocksDB headers needs about 1-2 GB.
  ninja -C "$KSTATE_BUILD" -j2 "$@"
}

# kstate_build_web: the dashboard (web/ -> web/dist, served at /ui/ via http.ui_dir)
# and the browser tests' packages (tests/e2e). `npm ci` runs when a lock file changed
# since the last install. Without a suitable node/npm it says so and returns 0: kstate
# works without the dashboard, and the e2e test then fails saying what is missing.
kstate_build_web() {
  phase "web: dashboard (web/dist) and browser test packages (tests/e2e)"
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "web: skipped: node and npm are not installed (scripts/setup installs them); /ui/ will say the dashboard is not built" >&2
    return 0
  fi
  # Vite 7 needs Node 20.19 or later.
  if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)'; then
    echo "web: skipped: node $(node --version) is too old (the build needs 20.19 or later)" >&2
    return 0
  fi
  local dir
  for dir in "$KSTATE_ROOT/web" "$KSTATE_ROOT/tests/e2e"; do
    local stamp=$dir/node_modules/.kstate-lock.sha256
    local want; want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
      echo "npm ci in ${dir#"$KSTATE_ROOT"/}"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || return 1
      echo "$want" >"$stamp"
    fi
  done
  (cd "$KSTATE_ROOT/web" && npm run --silent build) || return 1
}

# kstate_await_ready PID URL LOG [SECONDS]: waits until URL (an instance's /readyz)
# answers 200 and returns 0. PID is the `$!` of the launch: a background child of this
# very shell, so call this from the shell that started it, never from a subshell. Its
# liveness comes from the shell's job table, which knows the child from the fork on;
# nothing is read from /proc, where a child that has not exec'd yet still shows the
# shell's command line, and a reaped child's pid may already belong to someone else.
# Returns 1, with the tail of LOG and the reason on stderr, when the child exits first
# (with its exit status) or SECONDS (default 60) pass.
kstate_await_ready() {
  local pid=$1 url=$2 log=$3 limit=${4:-60}
  local deadline=$((SECONDS + limit)) status
  while :; do
    if ! kstate_job_running "$pid"; then
      status=0
      wait "$pid" || status=$?
      tail -n 20 "$log" >&2
      if [ "$status" -gt 128 ]; then
        echo "kstate (pid $pid) was killed by signal $((status - 128)) before it was ready; see $log" >&2
      else
        echo "kstate (pid $pid) exited with status $status before it was ready; see $log" >&2
      fi
      return 1
    fi
    if [ "$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$url")" = 200 ]; then return 0; fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$log" >&2
      echo "kstate (pid $pid) is running but $url did not answer 200 within $limit s; see $log" >&2
      return 1
    fi
    sleep 0.2
  done
}

# kstate_job_running PID: whether PID is a background job of this shell still running.
kstate_job_running() {
  local p
  for p in $(jobs -rp); do
    if [ "$p" = "$1" ]; then return 0; fi
  done
  return 1
}
