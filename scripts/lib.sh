# Shared by scripts/test and scripts/demo: repository paths, phase headers, build.
# Sourced, not executed.

KSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Build directory: $KSTATE_BUILD_DIR (relative paths are taken from the repository
# root) or build/.
KSTATE_BUILD=${KSTATE_BUILD_DIR:-build}
case "$KSTATE_BUILD" in /*) ;; *) KSTATE_BUILD=$KSTATE_ROOT/$KSTATE_BUILD ;; esac

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
  phase "build: $KSTATE_BUILD (RelWithDebInfo)${*:+, targets: $*}"
  if [ ! -f "$KSTATE_BUILD/build.ninja" ]; then
    cmake -S "$KSTATE_ROOT" -B "$KSTATE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  # -j2: a C++20 translation unit with Beast or RocksDB headers needs about 1-2 GB.
  ninja -C "$KSTATE_BUILD" -j2 "$@"
}
